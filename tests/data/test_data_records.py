"""Reading sources: file types, path vs hub resolution, and errors that name file, line, field."""

import gzip
import json
import logging
import re
import sys
import types

import pytest
from data_assets import ALPACA_V2, TINYSTORIES, write_jsonl

from rlhf_lit.data.records import InvalidRecord, Row, get_number, get_text, read_rows


def test_jsonl_reads_records_with_line_numbers(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "p1"}, "", {"prompt": "p2"}])
    rows = read_rows(path)
    assert rows == [Row(f"{path} line 1", {"prompt": "p1"}), Row(f"{path} line 3", {"prompt": "p2"})]


def test_gz_jsonl_json_array_and_max_records(tmp_path):
    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write('{"x": "1"}\n{"x": "2"}\n{"x": "3"}\n')
    assert [r.data["x"] for r in read_rows(str(gz))] == ["1", "2", "3"]
    assert [r.data["x"] for r in read_rows(str(gz), max_records=2)] == ["1", "2"]

    arr = tmp_path / "a.json.gz"
    with gzip.open(arr, "wt", encoding="utf-8") as f:
        json.dump([{"x": "a"}, {"x": "b"}], f)
    rows = read_rows(str(arr))
    assert [(r.where, r.data) for r in rows] == [(f"{arr} record 0", {"x": "a"}), (f"{arr} record 1", {"x": "b"})]


def test_txt_paragraphs_blank_line_separated(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("First para\nstill first.\n\n\nSecond one.\n  \nThird.\n", encoding="utf-8")
    rows = read_rows(str(path))
    assert [(r.where, r.data["text"]) for r in rows] == [
        (f"{path} line 1", "First para\nstill first."),
        (f"{path} line 5", "Second one."),
        (f"{path} line 7", "Third."),
    ]


def test_tinystories_asset_paragraph_count():
    # 4,300 paragraphs split at "\n\n", plus 2 more split at lines holding a single space
    # (lines 6285 and 6338), which this reader also counts as blank
    assert len(read_rows(str(TINYSTORIES))) == 4302


def test_missing_path_like_source_is_file_not_found_not_hub(tmp_path, monkeypatch):
    # a hub lookup would call datasets.load_dataset: make any such call fail loudly
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda *a, **k: pytest.fail("path-like source sent to the hub")
    monkeypatch.setitem(sys.modules, "datasets", fake)
    for source in ["./nope.jsonl", "../x", "/abs/none", "data/none.txt", "none.json", "x.gz"]:
        with pytest.raises(FileNotFoundError, match="data file not found"):
            read_rows(source)
    with pytest.raises(ValueError, match="is a directory"):
        read_rows(str(tmp_path))
    other = tmp_path / "a.csv"
    other.write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        read_rows(str(other))


def test_unparseable_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"prompt": "a"}, '{"prompt": "b"', {"prompt": "c"}])
    with pytest.raises(InvalidRecord, match=r"x\.jsonl line 2: not valid JSON"):
        read_rows(path)


def test_non_object_line_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"prompt": "a"}, "[1, 2]"])
    with pytest.raises(InvalidRecord, match=r"x\.jsonl line 2: expected a JSON object, got list"):
        read_rows(path)


def test_skip_invalid_counts_and_logs_once(tmp_path, caplog):
    path = write_jsonl(tmp_path / "x.jsonl", [{"a": "1"}, "{bad", "{bad", {"a": "2"}])
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        rows = read_rows(path, skip_invalid=True)
    assert [r.data["a"] for r in rows] == ["1", "2"]
    msgs = [r.getMessage() for r in caplog.records if "do not parse" in r.getMessage()]
    assert msgs == [f"{path}: skipped 2 lines that do not parse as a JSON object with each key once"]


def test_alpaca_v2_has_14_unparseable_lines(caplog):
    with pytest.raises(InvalidRecord, match=r"alpaca_libre_tasks_v2\.jsonl line 2279: not valid JSON"):
        read_rows(str(ALPACA_V2))
    with caplog.at_level(logging.INFO, logger="rlhf_lit.data"):
        rows = read_rows(str(ALPACA_V2), skip_invalid=True)
    assert len(rows) == 2294 - 14
    assert any("skipped 14 lines" in r.getMessage() for r in caplog.records)


def test_field_errors_name_place_and_field():
    row = Row("data/x.jsonl line 17", {"prompt": "p", "response": "r", "n": 3, "e": "  ", "m": "1"})
    with pytest.raises(
        InvalidRecord,
        match=r"^data/x\.jsonl line 17: field 'chosen' missing \(record keys: prompt, response, n, e, m\)$",
    ):
        get_text(row, "chosen")
    with pytest.raises(InvalidRecord, match=r"^data/x\.jsonl line 17: field 'n' must be a string, got int$"):
        get_text(row, "n")
    with pytest.raises(InvalidRecord, match=r"^data/x\.jsonl line 17: field 'e' is empty$"):
        get_text(row, "e")
    assert get_text(row, "absent", required=False) == ""
    assert get_text(row, "e", required=False) == "  "
    assert get_number(row, "n") == 3.0
    with pytest.raises(InvalidRecord, match=r"field 'm' must be a number, got str"):
        get_number(row, "m")


def test_hub_branch_via_monkeypatched_load_dataset(monkeypatch):
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        return [{"prompt": "hub p0"}, {"prompt": "hub p1"}, {"prompt": "hub p2"}]

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    rows = read_rows("org/prompts", split="test", subset="small", max_records=2)
    assert calls == [("org/prompts", "small", "test")]
    assert [(r.where, r.data["prompt"]) for r in rows] == [
        ("hub dataset 'org/prompts' (small) split 'test' row 0", "hub p0"),
        ("hub dataset 'org/prompts' (small) split 'test' row 1", "hub p1"),
    ]


def test_hub_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'rlhf-lit\[hub\]'"):
        read_rows("org/prompts")


def test_a_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    # Editors on Windows start UTF-8 files with U+FEFF; it must not reach the first prompt or key.
    txt = tmp_path / "prompts.txt"
    txt.write_text("\ufeffOnce upon a time\n\nThe end", encoding="utf-8")
    assert [r.data["text"] for r in read_rows(str(txt))] == ["Once upon a time", "The end"]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('\ufeff{"prompt": "a", "response": "b"}\n', encoding="utf-8")
    assert read_rows(str(jsonl))[0].data == {"prompt": "a", "response": "b"}


def test_undecodable_and_truncated_files_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nstill fine\ncaf\xe9\n")
    with pytest.raises(ValueError, match=r"bad.txt line 3: not UTF-8 text \(byte 0xe9 at offset 19\)"):
        read_rows(str(bad))
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(b"a paragraph\n" * 100)[:-20])
    with pytest.raises(ValueError, match=r"cut.txt.gz: not a complete gzip file"):
        read_rows(str(cut))


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x1c", "\x0b", "\x0c"])
def test_a_line_is_cut_at_line_feeds_only(tmp_path, separator):
    # json.dumps(ensure_ascii=False) writes these raw inside strings, as JSON allows; only "\n" ends a
    # JSON Lines record (a model's reply written by rlhf-lit's own labellers held a raw U+2028).
    text = f"one{separator}two"
    path = tmp_path / "x.jsonl"
    lines = [json.dumps({"prompt": text}, ensure_ascii=False), json.dumps({"prompt": "b"})]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
    rows = list(read_rows(str(path)))
    assert [r.data["prompt"] for r in rows] == [text, "b"]
    assert [r.where for r in rows] == [f"{path} line 1", f"{path} line 2"]
    story = tmp_path / "s.txt"
    story.write_text(f"a{separator}b\nc\n\nd\n", encoding="utf-8")
    assert [r.data["text"] for r in read_rows(str(story))] == [f"a{separator}b\nc", "d"]


@pytest.mark.parametrize("separator", ["\u2028", "\x85", "\x0c"])
def test_a_prompt_file_read_as_jsonl_or_lines_is_cut_at_line_feeds_only(tmp_path, separator):
    # The prompt sources' readings (format jsonl: JSON lines whatever the name; lines: one prompt a line)
    # follow the same rule: a separator inside a record or a prompt neither cuts it nor shifts the line numbers.
    path = tmp_path / "prompts.log"
    path.write_text(
        json.dumps({"prompt": f"a{separator}b"}, ensure_ascii=False) + '\n{"prompt": "c"}\n', encoding="utf-8"
    )
    rows = read_rows(str(path), reading="jsonl")
    assert [(r.where, r.data["prompt"]) for r in rows] == [
        (f"{path} line 1", f"a{separator}b"),
        (f"{path} line 2", "c"),
    ]
    lines = tmp_path / "prompts.txt"
    lines.write_text(f"a{separator}b\r\n\nc\n", encoding="utf-8")
    rows = read_rows(str(lines), reading="lines")
    assert [(r.where, r.data["text"]) for r in rows] == [
        (f"{lines} line 1", f"a{separator}b"),
        (f"{lines} line 3", "c"),
    ]


TWICE = [
    ('{"prompt": "p", "chosen": "a", "rejected": "b", "chosen": "b"}', "chosen"),
    ('{"prompt": [{"role": "user", "content": "p", "role": "assistant"}], "chosen": "a"}', "prompt[0].role"),
    ('{"prompt": "p", "meta": [[1, {"k": 1, "k": 2}]]}', "meta[0][1].k"),
]


@pytest.mark.parametrize(("record", "field"), TWICE)
def test_a_field_given_twice_is_refused_naming_the_record_and_the_field(tmp_path, record, field):
    # JSON readers keep the last of two equal keys without a word: the record would be read without the first.
    path = tmp_path / "x.jsonl"
    path.write_text('{"prompt": "fine"}\n' + record + "\n", encoding="utf-8")
    told = rf"x\.jsonl line 2: field '{re.escape(field)}' is given twice; JSON keeps only the last: remove one"
    with pytest.raises(InvalidRecord, match=told):
        read_rows(str(path))
    assert [r.data for r in read_rows(str(path), skip_invalid=True)] == [{"prompt": "fine"}]
    array = tmp_path / "x.json"
    array.write_text(f'[{{"prompt": "fine"}}, {record}]', encoding="utf-8")
    with pytest.raises(InvalidRecord, match=rf"x\.json record 1: field '{re.escape(field)}' is given twice"):
        read_rows(str(array))


@pytest.mark.parametrize("reading", ["by_name", "jsonl"])
def test_one_json_value_over_several_lines_is_named_not_called_invalid_line_by_line(tmp_path, reading):
    # json.dump(..., indent=2): the first line alone is no JSON; skip_invalid skipped every line to "no usable
    # examples" and without it the error said the valid file was not valid JSON.
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"data": [{"prompt": "a"}]}, indent=2) + "\n", encoding="utf-8")
    told = r"one\.jsonl: one JSON object over 7 lines \(keys: data\), not JSON Lines; write one record a line"
    for skip_invalid in (False, True):
        with pytest.raises(ValueError, match=told):
            read_rows(str(one), skip_invalid=skip_invalid, reading=reading)
    array = tmp_path / "array.jsonl"
    array.write_text(json.dumps([{"prompt": "a"}], indent=2), encoding="utf-8")
    told = r"array\.jsonl: one JSON array over 5 lines, not JSON Lines \(one record a line\); name the file \.json"
    with pytest.raises(ValueError, match=told):
        read_rows(str(array), reading=reading)
    bad = tmp_path / "bad.jsonl"  # a first line that is bad JSON in a file that is not one value: named as ever
    bad.write_text('{"prompt": "a"\n{"prompt": "b"}\n', encoding="utf-8")
    with pytest.raises(InvalidRecord, match=r"bad\.jsonl line 1: not valid JSON"):
        read_rows(str(bad), reading=reading)
