"""Preference pairs: the three row formats, what is malformed, supervision of the answer alone, and truncation that
keeps the end of the prompt and never cuts an answer."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from longboat.data.chat.builtin import resolve_chat_template
from longboat.data.chat.pairs import encode_pairs, fit_pair, normalise_pair, pack_pairs, read_pairs
from longboat.data.chat.sources import Malformed
from longboat.data.chat.supervision import ChatSupervisor
from longboat.data.labels import IGNORE_INDEX
from longboat.data.tokenizer import Tokenizer

TOKENIZER = Path(__file__).resolve().parents[2] / "fixtures" / "sft" / "tokenizer"


def supervisor() -> ChatSupervisor:
    tokenizer = Tokenizer(TOKENIZER)
    return ChatSupervisor(tokenizer, resolve_chat_template(tokenizer, None)[0])


def test_plain_text_conversational_and_implicit_prompts():
    plain = normalise_pair({"prompt": "Spell oar.", "chosen": "o a r", "rejected": "oar"})
    assert plain.prompt == [{"role": "user", "content": "Spell oar."}] and plain.chosen["content"] == "o a r"
    system = {"role": "system", "content": "Be terse."}
    user = {"role": "user", "content": "Spell oar."}
    explicit = normalise_pair({"prompt": [system, user], "chosen": [{"role": "assistant", "content": "o a r"}],
                               "rejected": [{"role": "assistant", "content": "oar"}]})
    implicit = normalise_pair({"chosen": [system, user, {"role": "assistant", "content": "o a r"}],
                               "rejected": [system, user, {"role": "assistant", "content": "oar"}]})
    assert explicit.prompt == implicit.prompt == [system, user]
    assert explicit.chosen == implicit.chosen and explicit.rejected == implicit.rejected


@pytest.mark.parametrize("row, reason", [
    ({"prompt": "p", "chosen": "a"}, "missing fields"),
    ({"prompt": "p", "chosen": "same", "rejected": "same"}, "identical answers"),
    ({"prompt": "p", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}, "mixed formats"),
    ({"prompt": [{"role": "user", "content": "p"}], "chosen": [{"role": "user", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "answer not one assistant turn"),
    ([1, 2], "not an object"),
])
def test_malformed_rows_name_their_reason(row, reason):
    with pytest.raises(Malformed) as e:
        normalise_pair(row)
    assert e.value.reason == reason


def test_only_the_final_answer_is_supervised_and_prompts_are_shared():
    earlier = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
               {"role": "user", "content": "Spell oar backwards."}]
    pair = normalise_pair({"prompt": earlier, "chosen": [{"role": "assistant", "content": "rao"}],
                           "rejected": [{"role": "assistant", "content": "oar oar"}]})
    (encoded,), refused = encode_pairs(supervisor(), [pair])
    assert not refused
    tokenizer = Tokenizer(TOKENIZER)
    for sample, answer in ((encoded.chosen, "rao"), (encoded.rejected, "oar oar")):
        supervised = sample.labels[sample.labels != IGNORE_INDEX]
        assert tokenizer.decode(supervised.tolist()).startswith(answer)  # the answer and the end-of-turn token
        assert "Hello" not in tokenizer.decode(supervised.tolist())
    n = encoded.prompt_tokens
    assert np.array_equal(encoded.chosen.tokens[:n], encoded.rejected.tokens[:n])


def test_truncation_cuts_the_start_of_the_prompt_and_drops_pairs_whose_answers_do_not_fit():
    long_prompt = "Spell " + "very " * 40 + "long words backwards."
    pair = normalise_pair({"prompt": long_prompt, "chosen": "sdrow gnol", "rejected": "long words"})
    (encoded,), _ = encode_pairs(supervisor(), [pair])
    counts = Counter()
    seq_len = len(encoded) - 20
    fitted = fit_pair(encoded, seq_len, counts)
    assert len(fitted) <= seq_len and counts["prompt truncated"] == 1
    for full, cut in ((encoded.chosen, fitted.chosen), (encoded.rejected, fitted.rejected)):
        assert np.array_equal(full.labels[full.labels != IGNORE_INDEX], cut.labels[cut.labels != IGNORE_INDEX])
        assert np.array_equal(full.tokens[-len(cut):], cut.tokens)  # the end is kept
    answers = int((encoded.chosen.labels != IGNORE_INDEX).sum() + (encoded.rejected.labels != IGNORE_INDEX).sum())
    assert fit_pair(encoded, answers, counts) is None and counts["dropped (answers longer than seq_len)"] == 1


def test_pairs_pack_whole_with_their_ids(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"Count to {i}.", "chosen": " ".join(map(str, range(1, i + 1))), "rejected": "no"}
            for i in range(2, 8)]
    rows.insert(2, {"prompt": "x", "chosen": "y"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs, report = read_pairs(path)
    assert len(pairs) == 6 and report.malformed == Counter({"missing fields": 1}) and report.examples == {
        "missing fields": [3]}
    encoded, _ = encode_pairs(supervisor(), pairs)
    rows = pack_pairs(encoded, 3 * max(len(p) for p in encoded), 0, pair_offset=10)
    seen = Counter()
    for r in range(len(rows)):
        item = rows[r]
        segments, pair_ids = item["segments"], item["pair_ids"]
        for s in segments.unique().tolist():
            if s == 0:
                continue
            ids = pair_ids[segments == s].unique().tolist()
            assert len(ids) == 1 and 10 <= ids[0] < 16
            seen[(ids[0], s % 2)] += 1
    assert len(rows) < 6  # packed: fewer rows than pairs
    assert sorted(seen) == [(i, k) for i in range(10, 16) for k in (0, 1)] and set(seen.values()) == {1}
