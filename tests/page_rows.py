"""The flips table of a report page (`adaptguard compare --html`, `adaptguard update`'s report.html) read from the
HTML alone: shared by tests/compat/test_html_page.py and tests/update/test_update_pick.py."""

from html.parser import HTMLParser


class Rows(HTMLParser):
    """(task, doc, direction) of each row of the flips table, and every src/href, read from the HTML alone."""

    def __init__(self):
        super().__init__()
        self.rows, self.links, self._cells, self._in = [], [], None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.links += [a[k] for k in ("src", "href") if k in a]
        if tag == "tr" and "data-kind" in a:
            self._cells = []
        if tag == "td" and self._cells is not None:
            self._in = True
            self._cells.append("")

    def handle_data(self, data):
        if self._in:
            self._cells[-1] += data

    def handle_endtag(self, tag):
        if tag == "td":
            self._in = False
        if tag == "tr" and self._cells is not None:
            self.rows.append((self._cells[0], int(self._cells[1]), self._cells[2]))
            self._cells = None
