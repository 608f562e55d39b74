"""Images for vision-language models: decoding user images (``decode``) and each family's pixel preprocessing (``qwen_vl``)."""
