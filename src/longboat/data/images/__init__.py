"""Images for vision-language models: decoding user images (``decode``), each family's preprocessing (``qwen_vl``)."""
