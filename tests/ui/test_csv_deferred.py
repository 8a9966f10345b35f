"""Every table's "Download CSV" writes its CSV when clicked, not on every run (the Class page's live tables were
written out at each refresh: 14% of the app's own CPU time during a 30-student class, py-spy --gil), and the file
a click gets is still the table's CSV."""
from __future__ import annotations

import textwrap

import pandas as pd
import streamlit as st
from streamlit.testing.v1 import AppTest

SCRIPT = textwrap.dedent("""
    import pandas as pd
    from ui.widgets import df_with_download
    df_with_download(pd.DataFrame({"request": ["student 1", "student 2"], "blocks": [3, 4]}), "class requests")
""")


def test_the_csv_is_written_on_click_only(tmp_path, monkeypatch):
    calls, given = [], []
    to_csv, download_button = pd.DataFrame.to_csv, st.download_button
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda self, *a, **k: calls.append(1) or to_csv(self, *a, **k))
    monkeypatch.setattr(st, "download_button", lambda label, data, **k: given.append(data) or
                        download_button(label, data, **k))
    script = tmp_path / "page.py"
    script.write_text(SCRIPT)
    at = AppTest.from_file(str(script)).run()
    assert not at.exception
    (button,) = at.get("download_button")
    assert calls == [] and button.proto.deferred_file_id and len(given) == 1   # nothing written by the run
    assert given[0]() == b"request,blocks\nstudent 1,3\nstudent 2,4\n"          # what a click gets
    assert calls == [1]
