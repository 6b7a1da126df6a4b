"""`tokenmill bench s3-fetch`: every client downloads the whole object set from moto's server
and the raw JSON says how fast."""

from __future__ import annotations

import json

from tokenmill.engine.cli import main


def test_every_client_downloads_the_whole_set(tmp_path, capsys):
    out = tmp_path / "s3.json"
    assert main(["bench", "s3-fetch", "--total-mb", "8", "--files", "2", "--repeats", "1",
                 "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload["summary"]) == {"tokenmill", "obstore", "boto3-transfer",
                                       "boto3-ranges"}
    assert all(s["mb_per_s_median"] > 0 for s in payload["summary"].values())
    assert payload["total_bytes"] == 8 << 20
