"""prepare-data's mistakes are one line naming the file: an oversize JSONL record refused before tokenizing, a tokenizer that does not load (issue 24)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runs import one_line_error, prepare_cli
from run_configs import target_path
from typer.testing import CliRunner


def test_an_oversize_jsonl_record_is_refused_before_tokenizing(
    tiny_world: Path, tmp_path: Path, monkeypatch
):
    """Before: one 50 MB record took 183 s and 20 GB of memory (the tokenizer ran over all of
    it) before prepare-data cut it to max_length."""
    from eagle_train.cli import prepare_data_app
    from eagle_train.data import prepare

    chats = (tiny_world / "data" / "train.jsonl").read_text().splitlines(keepends=True)[:3]
    answer = json.loads(chats[0])["messages"][-1]
    huge = {"messages": [{"role": "user", "content": "x" * 300_000}, answer]}
    data = tmp_path / "chats.jsonl"
    data.write_text(chats[0] + json.dumps(huge) + "\n" + chats[1])
    before = data.read_bytes()
    tokenized: list[int] = []
    real = prepare.ChatRenderer.tokenize_rows
    monkeypatch.setattr(
        prepare.ChatRenderer,
        "tokenize_rows",
        lambda self, messages, *a: (
            tokenized.append(len(json.dumps(messages))) or real(self, messages, *a)
        ),
    )
    target = target_path(tiny_world)
    args = []
    for s in (f"inputs=[{data}]", f"output_dir={tmp_path / 'out'}", f"tokenizer={target}"):
        args += ["--set", s]
    result = CliRunner().invoke(prepare_data_app, [*args, "--set", "max_length=256"])
    limit = 64 * 256 + 65536
    one_line_error(result, f"{data}:2: record of", f"over the {limit} bytes")
    assert data.read_bytes() == before and not (tmp_path / "out").exists()
    assert max(tokenized) < 300_000  # the huge record never reached the tokenizer


def test_a_bad_tokenizer_is_one_line(tiny_world: Path, tmp_path: Path):
    """Before: a misspelled tokenizer path printed four chained OSErrors; a tokenizer that
    needs trust_remote_code a ValueError traceback."""
    data = tiny_world / "data" / "train.jsonl"
    custom = tmp_path / "custom-tok"
    custom.mkdir()
    (custom / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "MyTok", "auto_map": {"AutoTokenizer": ["tok.MyTok", None]}})
    )
    (custom / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (custom / "tok.py").write_text("raise SystemExit('custom code ran')\n")
    typo = target_path(tiny_world, "llama", "bf61")
    for tokenizer, why in [
        (typo, f"tokenizer {typo}: no such directory"),
        (custom, f"tokenizer {custom}: it needs trust_remote_code"),
    ]:
        result = prepare_cli(
            f"inputs=[{data}]", f"output_dir={tmp_path / 'out'}", f"tokenizer={tokenizer}"
        )
        one_line_error(result, why)
        assert not (tmp_path / "out").exists()
