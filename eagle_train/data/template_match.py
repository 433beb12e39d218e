"""Is a prepared dataset rendered with its target's chat template?

``meta.json`` records the sha256 of the template the rows were rendered with; the target's
own template is read the way transformers reads it (``chat_template.jinja``, else the
``chat_template`` of ``tokenizer_config.json``). Training a draft on rows rendered with
another template teaches it text the target never sees when served, and nothing fails: so
``train-draft`` refuses the mismatch unless ``data.allow_chat_template_mismatch`` says it is
intended.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eagle_train.data.errors import DataError
from eagle_train.data.store import META_FILE, read_meta


def target_template(target: Path) -> str | None:
    """The chat template transformers would load from ``target`` (None: it has none)."""
    jinja = Path(target) / "chat_template.jinja"
    where = jinja
    try:
        if jinja.is_file():
            with open(jinja, encoding="utf-8") as f:  # as transformers reads it
                return f.read()
        where = Path(target) / "tokenizer_config.json"
        if not where.is_file():
            return None
        config = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataError(f"{where}: unreadable ({exc})", reason="config") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def check_chat_template(datasets: list[Path], target: Path, allowed: bool) -> None:
    """Refuse a dataset whose recorded template differs from ``target``'s (one line naming
    both), unless ``allowed``. A target without a template, or a dataset that recorded none,
    has nothing to compare."""
    template = target_template(target)
    if template is None or allowed:
        return
    sha = hashlib.sha256(template.encode()).hexdigest()
    for path in datasets:
        recorded = read_meta(path).get("chat_template")
        found = recorded.get("sha256") if isinstance(recorded, dict) else None
        if isinstance(found, str) and found != sha:
            source = recorded.get("source", "?") if isinstance(recorded, dict) else "?"
            raise DataError(
                f"{Path(path) / META_FILE}: rendered with chat template sha256 {found[:12]} "
                f"(from {source}), but the target {target} has template {sha[:12]}: prepare "
                "the data with the target's tokenizer, or set "
                "data.allow_chat_template_mismatch: true if this is intended",
                reason="config",
            )
