"""The table of models by task (``fedpriv run --help``, docs/reference/cli.md, the README),
generated from the algorithm registry (:mod:`fedpriv.algorithms.registry`: each spec's task) and
the personalization family (:data:`fedpriv.algorithms.registry.PERSONALIZATION`), so that no
registered name can be missing."""

from __future__ import annotations

import textwrap

from . import registry


def model_rows() -> list[tuple[str, str, str, bool, str]]:
    """(group, name, task kind, private, summary) of every algorithm, registered or
    personalization, grouped by :data:`registry.GROUPS` in registration order."""
    from .families import families

    rows = []
    for family in families():
        for name in family.algorithms():
            task, text = family.describe(name)
            rows.append((registry.TASKS[task][0], name, registry.kind_of(task), family.private(name), text))
    return sorted(rows, key=lambda r: registry.GROUPS.index(r[0]))


def model_table(form: str = "text", width: int = 100) -> str:
    """The table of models by task: ``form`` "text" (``fedpriv run --help``) or "markdown"
    (docs/reference/cli.md and the README, between their ``<!-- models:begin -->`` markers)."""
    rows = model_rows()
    if form == "markdown":
        lines = ["| task | model | private | what it is |", "|---|---|---|---|"]
        for group, name, kind, private, text in rows:
            label = f"{group} ({kind})" if group == registry.GROUPS[-1] else group
            lines.append(f"| {label} | `{name}` | {'yes' if private else 'no'} | {text.replace('|', '/')} |")
        return "\n".join(lines)
    if form != "text":
        raise ValueError(f"form must be text or markdown, got {form!r}")
    name_w = max(len(r[1]) for r in rows)
    lines = ["models by task (private: give --epsilon; references and baselines: compare with them):"]
    for group in registry.GROUPS:
        members = [r for r in rows if r[0] == group]
        if not members:
            continue
        lines.append(f"  {group}:")
        for _, name, kind, private, text in members:
            tag = ("private" if private else "non-private") + (f", {kind}" if group == registry.GROUPS[-1] else "")
            head = f"    {name:<{name_w}}  "
            lines += textwrap.wrap(
                f"{tag}: {text}", width=width, initial_indent=head, subsequent_indent=" " * len(head)
            )
    return "\n".join(lines)
