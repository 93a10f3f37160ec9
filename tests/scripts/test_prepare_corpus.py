"""Tests for scripts/prepare_lm_corpus.py (small inline data only; no shared/ data)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("sacremoses")
pytest.importorskip("sentence_splitter")

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_lm_corpus.py"
_spec = importlib.util.spec_from_file_location("prepare_lm_corpus", _SCRIPT)
P = importlib.util.module_from_spec(_spec)
sys.modules["prepare_lm_corpus"] = P
_spec.loader.exec_module(P)


def story(body: str, newid: int = 1) -> str:
    """One <REUTERS> element in the collection's layout, with a raw <BODY>."""
    return (
        f'<REUTERS TOPICS="YES" LEWISSPLIT="TRAIN" CGISPLIT="TRAINING-SET" OLDID="5544" NEWID="{newid}">\n'
        "<DATE>26-FEB-1987 15:01:01.79</DATE>\n"
        "<TOPICS><D>cocoa</D></TOPICS>\n"
        "<UNKNOWN> \n&#5;&#5;&#5;C T\n&#22;&#22;&#1;f0704&#31;reute\n"
        "u f BC-BAHIA-COCOA-REVIEW   02-26 0105</UNKNOWN>\n"
        "<TEXT>&#2;\n<TITLE>TITLE</TITLE>\n"
        f"<DATELINE>    SALVADOR, Feb 26 - </DATELINE><BODY>{body}</BODY></TEXT>\n"
        "</REUTERS>\n"
    )


def sgm(*bodies: str) -> str:
    return '<!DOCTYPE lewis SYSTEM "lewis.dtd">\n' + "".join(story(b, i + 1) for i, b in enumerate(bodies))


def write_sgm(path: Path, *bodies: str) -> Path:
    path.write_bytes(sgm(*bodies).encode("latin-1"))
    return path


# --------------------------------------------------------------------------
# Reuters body extraction
# --------------------------------------------------------------------------


def test_extract_bodies_entities_and_trailer(tmp_path):
    body1 = "Texaco Inc &lt;TX> said profits &amp; sales^M rose&#127;\nsharply in 1986.\n Reuter\n&#3;"
    body2 = "Shr 17 cts vs 13 cts\n     Net 2.1 mln vs 1.03 mln\n REUTER\n&#3;"
    f = write_sgm(tmp_path / "reut2-000.sgm", body1, body2)
    bodies = P.extract_reuters_bodies(f)
    assert bodies == [
        "Texaco Inc <TX> said profits & sales rose\nsharply in 1986.",
        "Shr 17 cts vs 13 cts\n     Net 2.1 mln vs 1.03 mln",
    ]
    for b in bodies:
        assert "&" not in b.replace(" & ", "")
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", b)
        assert "Reuter" not in b and "REUTER" not in b


@pytest.mark.parametrize(
    "tail, kept",
    [
        ("year.\n REUTER...^M\n&#3;", "year."),
        ("year.        REUTER\n&#3;", "year."),
        ("year.\nREUTER 11:43/VB\n&#3;", "year."),
        ("year.\n Reuter4\n&#3;", "year."),
        ("year.\n MORE\n&#3;", "year."),
        # "Reuters." naming the agency is text, not the trailer
        ("a bank official told\nReuters.\n&#3;", "a bank official told\nReuters."),
        # a body without any trailer is left alone
        ("year.\n&#3;", "year."),
    ],
)
def test_trailer_variants(tmp_path, tail, kept):
    f = write_sgm(tmp_path / "reut2-000.sgm", "Sales rose in the\n" + tail)
    assert P.extract_reuters_bodies(f) == ["Sales rose in the\n" + kept]


def test_extract_bodies_latin1_byte(tmp_path):
    f = tmp_path / "reut2-017.sgm"
    raw = sgm("Mr M\xfcller said.\n Reuter\n&#3;").encode("latin-1")
    assert b"\xfc" in raw  # a byte that is not valid UTF-8 on its own
    f.write_bytes(raw)
    assert P.extract_reuters_bodies(f) == ["Mr M\u00fcller said."]


def test_unwrap_paragraphs_tables_and_hyphens():
    body = (
        "The dry period means the temporao will be\n"
        "late this year, a long-\n"
        "term problem.\n"
        "    Arrivals for the week were 155,221 bags.\n"
        " Imports      26.21   26.27    27.08   27.08\n"
        "    CORDOBA............23.......12............1\n"
        "Merrill Lynch....7.30....5.75\n"
        "    Shr 17 cts vs 13 cts\n"
        "    Net 2.1 mln vs 1.03 mln\n"
        "gains.    The kwacha stood at 2.2 per dollar."
    )
    assert P.unwrap_paragraphs(body) == [
        "The dry period means the temporao will be late this year, a long-term problem.",
        "Arrivals for the week were 155,221 bags.",
        "Shr 17 cts vs 13 cts",
        "Net 2.1 mln vs 1.03 mln gains.",
        "The kwacha stood at 2.2 per dollar.",
    ]


@pytest.mark.parametrize(
    "line, table",
    [
        (" Imports      26.21   26.27    27.08   27.08", True),
        ("    SANTA FE...........--.......22............0", True),
        ("Wells Fargo Bank....7.30....5.60", True),
        ("    The dry period means the temporao will be late.", False),
        ("year, projected, was 3.5 billion .... It is in fact running ...", False),
        ("Shr 17 cts vs 13 cts", False),
    ],
)
def test_is_table_line(line, table):
    assert P.is_table_line(line) is table


def test_reuters_story_sentences_company_markers_and_filters():
    stats = P.Stats()
    body = (
        "Hoechst AG <HFAG.F> and <Kerdix Inc> agreed to pool research (SKF ST>.\n"
        "    The deal closes in April. Terms were not disclosed.\n"
        "    1,234.5 -- 5,678.9\n"
        " Wheat   2.62   2.40       IV     4.65"
    )
    assert P.reuters_story_sentences(body, stats) == [
        "Hoechst AG HFAG.F and Kerdix Inc agreed to pool research ( SKF ST .",
        "The deal closes in April .",
        "Terms were not disclosed .",
    ]
    assert stats.dropped_table_lines == 1
    assert stats.dropped_no_letter == 1


def test_duplicate_stories_are_dropped(tmp_path):
    a = "Cocoa rose.\n Reuter\n&#3;"
    b = "Sugar fell.\n Reuter\n&#3;"
    f1 = write_sgm(tmp_path / "reut2-000.sgm", a, b, a)
    f2 = write_sgm(tmp_path / "reut2-001.sgm", b, "Coffee was steady.\n REUTER\n&#3;")
    stats = P.Stats()
    docs = P.reuters_documents([f1, f2], stats)
    assert docs == [["Cocoa rose ."], ["Sugar fell ."], ["Coffee was steady ."]]
    assert stats.stories == 5
    assert stats.duplicate_stories == 2


# --------------------------------------------------------------------------
# Plain-text reading (ABC)
# --------------------------------------------------------------------------


def test_read_text_lines_crlf_and_latin1(tmp_path):
    f = tmp_path / "science.txt"
    f.write_bytes(b"Heated to 460\xb0C first. \r\nCaf\xc3\xa9 owners agree.\r\n\r\nLast line without newline")
    lines = P.read_text_lines(f)
    assert lines == [
        "Heated to 460\u00b0C first. ",
        "Caf\u00e9 owners agree.",
        "",
        "Last line without newline",
    ]
    assert not any("\r" in ln for ln in lines)


def test_abc_documents(tmp_path):
    f = tmp_path / "rural.txt"
    f.write_bytes(
        "PM denies knowledge of AWB kickbacks\n"
        "Prices rose.  Exports fell; it's \u201cbad\u201d, he said.\n"
        "\n"
        "2006 2007\n"
        "L'Or&eacute;al makes it\u00c2\".\n".encode("utf-8")
    )
    stats = P.Stats()
    docs = P.abc_documents([f], stats)
    assert docs == [
        ["PM denies knowledge of AWB kickbacks"],
        ["Prices rose .", 'Exports fell ; it \'s " bad , " he said .'],
        ["L 'Or\u00e9al makes it . \""],  # lm1b splits every letter'letter
    ]
    assert stats.dropped_no_letter == 1


# --------------------------------------------------------------------------
# Tokenization in the 1B Word Benchmark style
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        # sentences of the lm1b held-out shards, de-tokenized by hand
        (
            "But now, it's looking like the page that list Reps who won't talk will be the most popular.",
            "But now , it 's looking like the page that list Reps who won 't talk will be the most popular .",
        ),
        (
            "The payments, which began in March 2007 at $2,900 a month, dwindled to less than $800 a month.",
            "The payments , which began in March 2007 at $ 2,900 a month , dwindled to less than $ 800 a month .",
        ),
        (
            '"We bought it thinking it was totally livable as it was," Hanisch said.',
            '" We bought it thinking it was totally livable as it was , " Hanisch said .',
        ),
        (
            "Los Angeles police Lt. John Romero says the death toll may be as high as 20.",
            "Los Angeles police Lt. John Romero says the death toll may be as high as 20 .",
        ),
        (
            "The Iranian regime has reacted \u2014 beating up protesters (and opponents) in 1902!",
            "The Iranian regime has reacted -- beating up protesters ( and opponents ) in 1902 !",
        ),
        # English quote-comma normalisation of lm1b's normalize-punctuation.perl
        (
            "Two referred to as \u201ckickbacks\u201d, were common.",
            'Two referred to as " kickbacks , " were common .',
        ),
        # lm1b's tokenizer had no month abbreviations: "Feb . 14"
        ("It ended on Feb. 14 in the U.S.", "It ended on Feb . 14 in the U.S."),
        # no XML escaping (&quot; &amp; &lt;), no aggressive hyphen split
        ('A&T said "<b>" 18-12 e.g. 5.3 pct.', 'A & T said " < b > " 18-12 e.g. 5.3 pct .'),
        # ``...'' quotes and the 1990's
        ("He said ``no'' in the 1990's.", 'He said " no " in the 1990 \'s .'),
        # sentence-initial / final apostrophe split off, no trailing blank
        ("'Tis the season'", "' Tis the season '"),
    ],
)
def test_tokenize_1b_style(raw, expected):
    got = P.split_and_tokenize(raw)
    assert got == [expected]


def test_split_and_tokenize_several_sentences():
    text = (
        'Mr. Smith said prices rose 2.5 pct. "It is a good start," he said. '
        "Was it? The U.S. Treasury declined comment."
    )
    assert P.split_and_tokenize(text) == [
        "Mr. Smith said prices rose 2.5 pct .",
        '" It is a good start , " he said .',
        "Was it ?",
        "The U.S. Treasury declined comment .",
    ]


def test_tokens_are_single_blank_separated():
    for s in P.split_and_tokenize("He said.'  And   left\tnow'"):
        assert s == " ".join(s.split())


# --------------------------------------------------------------------------
# Held-out dedup, sharding, counts: the whole command
# --------------------------------------------------------------------------


def make_inputs(tmp_path: Path):
    rdir = tmp_path / "reuters"
    rdir.mkdir()
    shared = "The company did not give details."
    for i in range(20):
        bodies = [
            f"Story {i} says cocoa rose {i} pct.\n    {shared}\n Reuter\n&#3;",
            f"Oil prices were steady.\n    Traders said demand was weak in week {i}.\n Reuter\n&#3;",
        ]
        if i == 0:
            bodies.append(bodies[0])  # exact duplicate story
        write_sgm(rdir / f"reut2-{i:03d}.sgm", *bodies)
    write_sgm(rdir / "reut2-020.sgm", f"Valid story one.\n    {shared}\n Reuter\n&#3;")
    write_sgm(rdir / "reut2-021.sgm", "Test story one.\n    Test story two.\n Reuter\n&#3;")
    adir = tmp_path / "abc"
    adir.mkdir()
    (adir / "rural.txt").write_bytes(b"Wheat exports fell.\nOil prices were steady.\n")
    (adir / "science.txt").write_bytes(b"Heated to 460\xb0C.\r\nSeen in the lm1b shard .\r\n")
    hdir = tmp_path / "lm1b"
    hdir.mkdir()
    (hdir / "news.en.heldout-00010-of-00050").write_text(
        "Seen in the lm1b shard .\nWheat exports fell .\n", encoding="utf-8"
    )
    return rdir, adir, hdir


def test_main_end_to_end(tmp_path, capsys):
    rdir, adir, hdir = make_inputs(tmp_path)
    out = tmp_path / "out"
    rc = P.main(
        [
            "--reuters",
            str(rdir),
            "--abc",
            str(adir),
            "--heldout",
            str(hdir),
            "--out",
            str(out),
            "--shards",
            "3",
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()

    shards = sorted((out / "train").iterdir())
    assert [p.name for p in shards] == [f"train-{i:05d}-of-00003.txt" for i in range(3)]
    assert not list(out.rglob("*.tmp"))
    train = [ln for p in shards for ln in p.read_text(encoding="utf-8").splitlines()]
    valid = (out / "heldout" / "reuters-valid.txt").read_text(encoding="utf-8").splitlines()
    test = (out / "heldout" / "reuters-test.txt").read_text(encoding="utf-8").splitlines()
    assert valid == ["Valid story one .", "The company did not give details ."]
    assert test == ["Test story one .", "Test story two ."]

    # document order is kept; the duplicate story of reut2-000 is gone
    assert train[:3] == [
        "Story 0 says cocoa rose 0 pct .",
        "Oil prices were steady .",
        "Traders said demand was weak in week 0 .",
    ]
    assert train.count("Story 0 says cocoa rose 0 pct .") == 1
    # held-out overlap removed: Reuters valid sentence and lm1b sentences
    assert "The company did not give details ." not in train
    assert "Wheat exports fell ." not in train
    assert "Seen in the lm1b shard ." not in train
    # repeated running-text sentences are kept (20 Reuters stories + 1 ABC line)
    assert train.count("Oil prices were steady .") == 21
    # "C" is a non-breaking prefix (initials), so lm1b's tokenizer keeps "C." too
    assert train[-1] == "Heated to 460 \u00b0 C."
    assert len(train) == 20 + 2 * 20 + 2
    # shards are contiguous and balanced
    sizes = [len(p.read_text(encoding="utf-8").splitlines()) for p in shards]
    assert sum(sizes) == len(train) and max(sizes) - min(sizes) <= 1

    # printed counts agree with the files
    stdout = captured.out

    def row(name):
        m = re.search(rf"^{re.escape(name)}\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s*$", stdout, re.M)
        assert m, f"no row for {name}:\n{stdout}"
        return tuple(int(g.replace(",", "")) for g in m.groups())

    def expect(lines):
        return (
            len(lines),
            sum(len(s.split()) for s in lines),
            len({t for s in lines for t in s.split()}),
        )

    assert row("heldout/reuters-valid.txt") == expect(valid)
    assert row("heldout/reuters-test.txt") == expect(test)
    assert row("train/train-00001-of-00003.txt") == expect(
        (out / "train" / "train-00001-of-00003.txt").read_text(encoding="utf-8").splitlines()
    )
    assert row("train (all shards)") == expect(train)
    assert row("total (all files)") == expect(train + valid + test)
    assert "exact duplicate stories dropped: 1" in stdout
    assert "removed as also in Reuters valid/test: 20" in stdout
    assert re.search(r"removed as also in --heldout files \(2 sentences, 1 files\): 2\b", stdout)
    # "Oil prices were steady ." 21x
    assert "repeated training sentences (kept): 1 distinct" in stdout
    assert "20 extra occurrences" in stdout
    # progress goes to stderr, not stdout
    assert "reut2-000.sgm" in captured.err
    assert "reut2-000.sgm" not in stdout

    # a second run with fewer shards replaces the old shard set
    P.main(["--reuters", str(rdir), "--out", str(out), "--shards", "2", "--seed", "1"])
    names = sorted(p.name for p in (out / "train").iterdir())
    assert names == ["train-00000-of-00002.txt", "train-00001-of-00002.txt"]
    train2 = [ln for n in names for ln in (out / "train" / n).read_text(encoding="utf-8").splitlines()]
    assert sorted(train2) != sorted(train)  # no ABC this time
    assert len(train2) == 20 + 2 * 20


def test_seed_shuffles_documents_not_sentences(tmp_path, capsys):
    rdir, adir, hdir = make_inputs(tmp_path)
    runs = []
    for seed in (None, 7, 7):
        out = tmp_path / f"out{seed}{len(runs)}"
        argv = ["--reuters", str(rdir), "--out", str(out)]
        if seed is not None:
            argv += ["--seed", str(seed)]
        P.main(argv)
        runs.append((out / "train" / "train-00000-of-00001.txt").read_text(encoding="utf-8").splitlines())
    plain, s1, s2 = runs
    assert s1 == s2 and sorted(s1) == sorted(plain) and s1 != plain
    # each story's two sentences stay adjacent and in order
    for i, s in enumerate(s1):
        if s == "Oil prices were steady .":
            assert s1[i + 1].startswith("Traders said demand was weak in week ")


def test_missing_input_dir_gives_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        P.main(["--reuters", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert "--reuters directory not found" in str(exc.value)
    assert not (tmp_path / "o").exists()

    rdir, adir, hdir = make_inputs(tmp_path)
    for flag in ("--abc", "--heldout"):
        with pytest.raises(SystemExit) as exc:
            P.main(
                [
                    "--reuters",
                    str(rdir),
                    flag,
                    str(tmp_path / "missing"),
                    "--out",
                    str(tmp_path / "o"),
                ]
            )
        assert f"{flag} " in str(exc.value) and "not found" in str(exc.value)

    (rdir / "reut2-021.sgm").unlink()
    with pytest.raises(SystemExit) as exc:
        P.main(["--reuters", str(rdir), "--out", str(tmp_path / "o")])
    assert "reut2-021.sgm" in str(exc.value)
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------
# Wikipedia (wikiextractor output)
# --------------------------------------------------------------------------

WIKI = """<doc id="1" url="?curid=1" title="Jarred Shaw">
Jarred Shaw

Jarred Shaw (born September 28, 1990) is an American basketball player. He plays in Uruguay.
Professional career.
!colspan=9 style=|Regular Season
On October 31, 2015, Shaw was selected by the Santa Cruz Warriors.
Mr. Shaw's teams
</doc>
<doc id="2" url="?curid=2" title="Stub">
Stub


</doc>
"""


def test_wikipedia_titles_headings_and_markup_are_dropped(tmp_path):
    (tmp_path / "wiki_00").write_text(WIKI, encoding="utf-8")
    docs = P.wikipedia_documents([tmp_path / "wiki_00"], P.Stats())
    assert docs == [
        [
            "Jarred Shaw ( born September 28 , 1990 ) is an American basketball player .",
            "He plays in Uruguay .",
            "On October 31 , 2015 , Shaw was selected by the Santa Cruz Warriors .",
        ]
    ]


def test_main_with_wikipedia_holds_out_the_last_file(tmp_path, capsys):
    rdir, adir, hdir = make_inputs(tmp_path)
    wdir = tmp_path / "wiki"
    wdir.mkdir()
    extra = "A held-out sentence about Uruguay, for this test."
    (wdir / "wiki_00").write_text(WIKI.replace("Uruguay.", "Uruguay.\n" + extra), encoding="utf-8")
    (wdir / "wiki_01").write_text(f'<doc id="3" url="?curid=3" title="T">\nT\n\n{extra}\n</doc>\n',
                                  encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--reuters", str(rdir), "--abc", str(adir), "--heldout", str(hdir), "--out", str(out)]
    assert P.main(argv + ["--wikipedia", str(wdir)]) == 0
    capsys.readouterr()
    train = (out / "train" / "train-00000-of-00001.txt").read_text(encoding="utf-8").splitlines()
    wiki_test = (out / "heldout" / "wikipedia-test.txt").read_text(encoding="utf-8").splitlines()
    assert wiki_test == ["A held-out sentence about Uruguay , for this test ."]
    assert "He plays in Uruguay ." in train and "A held-out sentence about Uruguay , for this test ." not in train
    with pytest.raises(SystemExit, match="wiki_\\* file"):
        P.main(argv + ["--wikipedia", str(wdir), "--wikipedia-heldout", "2"])


def test_build_mix_corpus_script_deals_news_three_times_and_checks_the_sums(tmp_path):
    """scripts/build_mix_corpus.sh: the three corpora of the continuation run, then the check
    against a sums list (a wrong list fails the script; the right one passes, stages skipped)."""
    import hashlib
    import os
    import subprocess
    import sys

    rdir, adir, hdir = make_inputs(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    for name, folder in (("reuters21578", rdir), ("abc_news", adir), ("lm1b_heldout", hdir)):
        (data / name).symlink_to(folder)
    (data / "wikipedia").mkdir()
    (data / "wikipedia" / "wiki_00").write_text(WIKI, encoding="utf-8")
    (data / "wikipedia" / "wiki_01").write_text(
        '<doc id="3" url="?curid=3" title="T">\nT\n\nA held-out line.\n</doc>\n', encoding="utf-8"
    )
    script = Path(__file__).resolve().parents[2] / "scripts" / "build_mix_corpus.sh"
    sums = tmp_path / "sums.txt"
    sums.write_text("0" * 64 + "  mix-train-00000-of-00024.txt\n")
    env = dict(os.environ, MIX_SUMS=str(sums), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    out = tmp_path / "runs"
    run = subprocess.run(["bash", str(script), str(data), str(out)], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr
    shards = sorted((out / "corpus-mix2").glob("*.txt"))
    assert len(shards) == 24
    mixed = sorted(line for shard in shards for line in shard.read_text(encoding="utf-8").splitlines())
    news = [line for f in (out / "corpus" / "train").glob("*.txt") for line in f.read_text().splitlines()]
    wiki = [line for f in (out / "corpus-wiki" / "train").glob("*.txt") for line in f.read_text().splitlines()]
    assert "He plays in Uruguay ." in wiki and "He plays in Uruguay ." not in news
    assert mixed == sorted(wiki + news + news)  # corpus-wiki holds the news once; it is given twice more
    sums.write_text("".join(f"{hashlib.sha256(s.read_bytes()).hexdigest()}  {s.name}\n" for s in shards))
    run = subprocess.run(["bash", str(script), str(data), str(out)], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "matches sums.txt" in run.stdout, run.stderr
