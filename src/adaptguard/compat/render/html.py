"""The pieces of one self-contained HTML page per comparison (`page.compare_page`, the update's `report.html`): the
verdict, tables, an inline figure, and the flipped items — prompt, gold, old and new answer, the changed words
marked — filterable by task and direction, searchable and sortable.

Nothing is fetched: the CSS, the script and the figure (base64 PNG) are inline, so the file opens from disk in any
browser and can be attached to a CI run. Without its script the page still reads: every table is HTML, and the
script only filters, searches and sorts the rows that are there.
"""

from __future__ import annotations

import base64
import difflib
import html

from ..verdicts import NOTHING_GATED, OUTCOMES

CAP_PER_TASK = 300  # flipped items shown per task (the rest are counted, and in --flips-out)

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px} table{border-collapse:collapse;width:100%;margin:8px 0}
th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4;position:sticky;top:0} th.sortable{cursor:pointer} th.sortable:after{content:" ⇅";color:#999}
.verdict{font-size:16px;padding:10px 14px;border-radius:6px;background:#f2f2f2;border:1px solid #bbb}
.note{color:#666;font-size:13px}
.kind-negative td.kind{color:#b00;font-weight:600} .kind-positive td.kind{color:#070;font-weight:600}
del,ins{background:#fff3bf;text-decoration:none;border-bottom:1px dotted #a80}
.right{color:#070;font-weight:600} .wrong{color:#b00;font-weight:600} .beyond{font-weight:600}
ul.decisions.breach li{color:#900} ul.decisions li{margin:2px 0}
.controls{display:flex;gap:12px;align-items:center;margin:8px 0;flex-wrap:wrap} .prompt{max-width:420px}
td.answer{font-family:ui-monospace,Menlo,monospace;font-size:13px;white-space:pre-wrap}
img{max-width:100%} code{background:#f4f4f4;padding:0 3px}
""" + "".join(f".verdict.{o.word}{{background:{o.colour[0]};border-color:{o.colour[1]}}}\n" for o in OUTCOMES.values())

SCRIPT = """
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll('#flips tbody tr'));
  var task = document.getElementById('task'), kind = document.getElementById('kind');
  var search = document.getElementById('search'), shown = document.getElementById('shown');
  var beyond = document.getElementById('beyond'), changed = document.getElementById('changed');
  function apply() {
    var t = task.value, k = kind.value, q = search.value.toLowerCase(), n = 0;
    rows.forEach(function (r) {
      var ok = (!t || r.dataset.task === t) && (!k || r.dataset.kind === k) &&
               (!beyond || !beyond.checked || r.dataset.beyond === '1') &&
               (!changed.checked || r.dataset.changed === '1') &&
               (!q || r.textContent.toLowerCase().indexOf(q) >= 0);
      r.style.display = ok ? '' : 'none';
      if (ok) n++;
    });
    shown.textContent = n;
  }
  [task, kind, beyond, changed].forEach(function (e) { if (e) e.addEventListener('change', apply); });
  search.addEventListener('input', apply);
  document.querySelectorAll('#flips th.sortable').forEach(function (th, col) {
    var up = true;
    th.addEventListener('click', function () {
      var idx = Array.prototype.indexOf.call(th.parentNode.children, th);
      var body = document.querySelector('#flips tbody');
      rows.sort(function (a, b) {
        var x = a.children[idx].dataset.sort || a.children[idx].textContent;
        var y = b.children[idx].dataset.sort || b.children[idx].textContent;
        var nx = parseFloat(x), ny = parseFloat(y);
        var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
        return up ? c : -c;
      });
      up = !up;
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  apply();
})();
"""


def escaped(value) -> str:
    """`value` as HTML text, escaped (None as nothing)."""
    return html.escape("" if value is None else str(value))


def marked_difference(old: str, new: str) -> tuple[str, str]:
    """(old, new) as HTML with the words that differ marked: `<del>` in the old answer, `<ins>` in the new (styled
    alike: which answer is right is said in words beside it, not by a diff's red and green)."""
    a, b = str(old).split(" "), str(new).split(" ")
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        x, y = escaped(" ".join(a[i1:i2])), escaped(" ".join(b[j1:j2]))
        if op == "equal":
            left.append(x)
            right.append(y)
        else:
            if x:
                left.append(f"<del>{x}</del>")
            if y:
                right.append(f"<ins>{y}</ins>")
    return " ".join(left), " ".join(right)


def table(header: list[str], rows: list[list[str]], escape: bool = True) -> str:
    head = "".join(f"<th>{escaped(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escaped(c) if escape else c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict_word(right: bool | None) -> str:
    if right is None:
        return ""
    return '<span class="right">right: </span>' if right else '<span class="wrong">wrong: </span>'


def flips_section(flips: list[dict], counts: dict[str, dict[str, int]], cap: int = CAP_PER_TASK,
                  note: str = "") -> str:
    """The flipped items' table with its controls. `flips`: `[{task, doc_id, kind, prompt, gold, old, new}]`
    (negative first), with `pairs`, `of_pairs`, `beyond_noise` for items of replicate runs and `delta` for items
    scored by similarity; `counts`: per task, how many flips of each kind there are in all (for the capped note)."""
    shown, per_task = [], {}
    for f in flips:
        k = (f["task"], f["kind"])
        per_task[k] = per_task.get(k, 0) + 1
        if per_task[k] <= cap:
            shown.append(f)
    capped = [f"{task}: {n - cap} more {kind} flips not shown" for (task, kind), n in per_task.items() if n > cap]
    tasks = sorted({f["task"] for f in flips})
    replicated = any("pairs" in f for f in flips)
    rows = []
    for f in shown:
        old, new = (marked_difference(f["old"], f["new"]) if isinstance(f["old"], str) and isinstance(f["new"], str)
                    else (escaped(f["old"]), escaped(f["new"])))
        label = "broke" if f["kind"] == "negative" else "fixed"
        # a 0/1 flip: the old answer was right when it broke; a similarity flip has no right or wrong
        old_right = None if "delta" in f else f["kind"] == "negative"
        pairs = ""
        if replicated:
            text = (f"{label} in {f['pairs']} of {f['of_pairs']} pairs" if "pairs" in f else "")
            if f.get("beyond_noise"):
                text += " — beyond rerun noise"
            pairs = f'<td class="{"beyond" if f.get("beyond_noise") else ""}">{escaped(text)}</td>'
        rows.append(f'<tr class="kind-{f["kind"]}" data-task="{escaped(f["task"])}" data-kind="{label}" '
                    f'data-beyond="{int(bool(f.get("beyond_noise")))}" data-changed="{int(f["old"] != f["new"])}">'
                    f'<td>{escaped(f["task"])}</td><td data-sort="{escaped(f["doc_id"])}">{escaped(f["doc_id"])}</td>'
                    f'<td class="kind">{label}</td>{pairs}<td class="prompt">{escaped(f.get("prompt"))}</td>'
                    f'<td class="answer">{escaped(f.get("gold"))}</td>'
                    f'<td class="answer">{_verdict_word(old_right)}{old}</td>'
                    f'<td class="answer">{_verdict_word(None if old_right is None else not old_right)}{new}</td></tr>')
    options = "".join(f'<option value="{escaped(t)}">{escaped(t)}</option>' for t in tasks)
    total = sum(n for c in counts.values() for n in c.values())
    headers = ("task", "doc", "direction", *(("run pairs",) if replicated else ()), "prompt", "gold", "old answer",
               "new answer")
    return (f'<h2>The flipped items</h2><p class="note">{escaped(note)}Broke = right before, wrong after (a negative '
            f'flip); fixed = wrong before, right after. {total} flipped items in all; each answer is marked right or '
            f'wrong, and the words that changed between them are highlighted.</p>'
            + (f'<p class="note" id="capped">Up to {cap} per task and direction are shown: '
               f'{escaped("; ".join(capped))} (every flip: <code>--flips-out</code>).</p>' if capped else "")
            + f'<div class="controls"><label>task <select id="task"><option value="">all</option>{options}</select>'
              f'</label><label>direction <select id="kind"><option value="">both</option><option value="broke">'
              f'broke</option><option value="fixed">fixed</option></select></label>'
            + ('<label><input id="beyond" type="checkbox"> beyond noise only</label>' if replicated else "")
            + '<label><input id="changed" type="checkbox"> changed answers only</label>'
              '<label>search <input id="search" type="search" placeholder="prompt or answer"></label><span><span '
              f'id="shown">{len(rows)}</span> shown</span></div>'
            + '<table id="flips"><thead><tr>' + "".join(f'<th class="sortable">{h}</th>' for h in headers)
            + f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')


VERDICT_STATUSES = (*(o.word for o in OUTCOMES.values()), NOTHING_GATED)  # red, amber, green; neutral: nothing gated


def page(title: str, verdict: str, status: str, sections: list[str]) -> str:
    """The whole page: title, the verdict first, coloured by `status` (`VERDICT_STATUSES`), then the sections (HTML
    strings), the style and script inline."""
    if status not in VERDICT_STATUSES:
        raise ValueError(f"page status must be one of {VERDICT_STATUSES}, got {status!r}")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escaped(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head><body>'
            f'<h1>{escaped(title)}</h1><div class="verdict {status}" id="verdict">{escaped(verdict)}</div>'
            + "".join(sections) + f"<script>{SCRIPT}</script></body></html>\n")


def figure(png: bytes, alt: str) -> str:
    return f'<img alt="{escaped(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
