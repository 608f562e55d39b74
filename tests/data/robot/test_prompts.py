from pathlib import Path

from longboat.data.robot.prompts import PromptTokens
from longboat.data.tokenizer import Tokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "fixtures" / "vlm" / "tokenizer"


def test_suffix_is_appended_once_then_truncated_and_padded():
    tok = Tokenizer(TOKENIZER)
    prompts = PromptTokens(tok, 32, suffix="\n")
    tokens, mask = prompts("pick the cube")
    assert tokens[mask].tolist() == tok.encode("pick the cube\n")
    assert prompts("pick the cube\n")[0].tolist() == tokens.tolist()  # a prompt ending with it is kept
    short, short_mask = PromptTokens(tok, 3, suffix="\n")("pick the cube")
    assert short.tolist() == tok.encode("pick the cube\n")[:3] and short_mask.all()
    plain, plain_mask = PromptTokens(tok, 32)("pick the cube")
    assert plain[plain_mask].tolist() == tok.encode("pick the cube")
