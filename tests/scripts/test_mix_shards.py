"""scripts/mix_shards.py: every input line once per mention, each shard mixing the sources."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mix_shards.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_shards_hold_the_input_lines_with_repeats_and_mix_the_sources(tmp_path):
    news = tmp_path / "news.txt"
    wiki = tmp_path / "wiki.txt"
    news.write_text("".join(f"news {i} .\n" for i in range(40)) + "\n", encoding="utf-8")
    wiki.write_text("".join(f"wiki {i} é\n" for i in range(120)), encoding="utf-8")
    done = run(str(news), str(news), str(wiki), "--out", str(tmp_path / "out"), "--shards", "4", "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert "3 files, 200 sentences, 600 tokens -> 4 shards" in done.stdout
    shards = sorted((tmp_path / "out").glob("mix-train-*-of-00004.txt"))
    assert len(shards) == 4
    lines = [line for s in shards for line in s.read_text(encoding="utf-8").splitlines()]
    expected = Counter(news.read_text(encoding="utf-8").split("\n")[:40] * 2)
    expected.update(wiki.read_text(encoding="utf-8").splitlines())
    assert Counter(lines) == expected
    for s in shards:  # each shard has both sources
        text = s.read_text(encoding="utf-8")
        assert "news" in text and "wiki" in text
    again = run(str(news), str(news), str(wiki), "--out", str(tmp_path / "again"), "--shards", "4", "--seed", "3")
    assert again.returncode == 0
    assert [s.read_bytes() for s in shards] == [
        (tmp_path / "again" / s.name).read_bytes() for s in shards
    ]


def test_a_pattern_that_matches_nothing_is_a_one_line_error(tmp_path):
    done = run(str(tmp_path / "missing-*.txt"), "--out", str(tmp_path / "out"))
    assert done.returncode != 0
    assert done.stderr.strip() == f"mix_shards: error: no file matches {str(tmp_path / 'missing-*.txt')!r}"
