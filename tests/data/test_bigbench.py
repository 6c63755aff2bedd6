"""BIG-bench tasks read from wherever their data is into local lm-eval tasks (a small archive and folder of the
sdist's layout stand in for the 358 MB download; a local HTTP server for the package index)."""

import hashlib
import http.server
import io
import json
import sys
import tarfile
import threading

import pytest
from bigbench_tasks import QA, TOY


def fake_sdist(path, tasks):
    with tarfile.open(path, "w:gz") as archive:
        for name, task in tasks.items():
            data = json.dumps(task).encode()
            info = tarfile.TarInfo(f"bigbench-1.0.0/bigbench/benchmark_tasks/{name}/task.json")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_load_tasks_reads_multiple_choice_examples_with_bigbench_prompts(tmp_path, monkeypatch):
    from adaptguard.data.bigbench import BigBenchUnavailable, load_tasks

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    sdist = fake_sdist(tmp_path / "bigbench-1.0.0.tar.gz", {"toy": TOY, "qa": QA})
    tasks = load_tasks(["toy", "qa"], sdist=sdist)
    assert tasks["toy"] == [
        {"input": "Is it true?\nQ: The sky is blue.\nA:", "choices": ["T", "F"], "label": 0},
        {"input": "Is it true?\nQ: Fish fly.\nA:", "choices": ["T", "F"], "label": 1}]
    # BIG-bench's defaults: no prefix, choices listed after the question
    assert tasks["qa"] == [{"input": "Q: 2 + 2?\n  choice: 3\n  choice: 4\n  choice: 5\nA:",
                            "choices": ["3", "4", "5"], "label": 1}]
    sdist.unlink()  # read once into the cache: no archive needed any more
    assert load_tasks(["toy"]) == {"toy": tasks["toy"]}
    with pytest.raises(BigBenchUnavailable, match=f"the BIG-bench path {sdist}: no such file or folder"):
        load_tasks(["other"], sdist=sdist)
    with pytest.raises(ValueError, match=r"no task.json for \['nope'\]"):
        load_tasks(["nope"], sdist=fake_sdist(tmp_path / "again.tar.gz", {"toy": TOY}))


def test_generative_task_reads_subtasks_with_one_target(tmp_path, monkeypatch):
    from adaptguard.data.bigbench import load_generative_task

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    sub_b = {"task_prefix": "Add.", "examples": [{"input": "1 + 1?", "target": "2"},
                                                 {"input": "two answers", "target": ["a", "b"]},  # dropped
                                                 {"input": "one in a list", "target": [" 7 "]}]}
    sub_a = {"examples": [{"input": "Unscramble: hte", "target": "the", "target_scores": {"the": 1}},
                          {"input": "scores only", "target_scores": {"x": 1, "y": 0}}]}  # dropped: no target
    sdist = fake_sdist(tmp_path / "bigbench-1.0.0.tar.gz", {"gen": {"examples": []}, "gen/b_sub": sub_b,
                                                            "gen/a_sub": sub_a, "other": QA})
    rows = load_generative_task("gen", sdist=sdist)
    # subtasks in path order, each with its own prefix; the target stripped
    assert rows == [{"input": "Q: Unscramble: hte\nA:", "target": "the", "subtask": "a_sub"},
                    {"input": "Add.\nQ: 1 + 1?\nA:", "target": "2", "subtask": "b_sub"},
                    {"input": "Add.\nQ: one in a list\nA:", "target": "7", "subtask": "b_sub"}]
    sdist.unlink()
    assert load_generative_task("gen") == rows  # cached
    with pytest.raises(ValueError, match="'nope' has no examples with one target string"):
        load_generative_task("nope", sdist=fake_sdist(tmp_path / "again.tar.gz", {"other": QA}))


def test_written_tasks_load_in_lm_eval(tmp_path):
    from lm_eval.tasks import TaskManager, get_task_dict

    from adaptguard.data.bigbench import write_lm_eval_tasks

    rows = [{"input": "Q: 2 + 2?\nA:", "choices": ["3", "4"], "label": 1}] * 3
    names = write_lm_eval_tasks({"qa": rows}, tmp_path, limit=2)
    assert names == ["bb_qa"]
    task = get_task_dict(names, TaskManager(include_path=str(tmp_path)))["bb_qa"]
    docs = list(task.test_docs())
    assert len(docs) == 2
    assert task.doc_to_text(docs[0]) == "Q: 2 + 2?\nA:" and task.doc_to_choice(docs[0]) == ["3", "4"]
    assert task.doc_to_target(docs[0]) == 1


def fake_checkout(folder, tasks):
    """BIG-bench's data unpacked (an sdist or a checkout): bigbench/benchmark_tasks/<task>/task.json."""
    for name, task in tasks.items():
        path = folder / "bigbench" / "benchmark_tasks" / name / "task.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(task))
    return folder


class Index:
    """A package index's simple page for bigbench on localhost, listing `files` {name: bytes} with their sha256."""

    def __init__(self, files):
        page = "".join(f'<a href="/files/{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>\n'
                       for name, data in files.items())
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler):
                self.requests.append(handler.path)
                body = page.encode() if handler.path == "/simple/bigbench/" else files.get(
                    handler.path.removeprefix("/files/"))
                handler.send_response(200 if body is not None else 404)
                handler.end_headers()
                handler.wfile.write(body or b"")

            def log_message(handler, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_data_is_taken_from_where_it_already_is_in_order(tmp_path, monkeypatch):
    """A path given (argument, then $ADAPTGUARD_BIGBENCH), an installed bigbench package with its tasks, the cache,
    and only then the package index: each source is used while the ones before it are absent, and a given source is
    read where it is when it is a folder (an archive's files are kept in the cache: 358 MB to scan)."""
    from adaptguard.data import bigbench

    cache = tmp_path / "cache"
    monkeypatch.setenv("ADAPTGUARD_CACHE", str(cache))
    qa = lambda answer: {"examples": [{"input": "2 + 2?", "target_scores": {"3": 0, answer: 1}}]}  # noqa: E731
    index = Index({"bigbench-1.0.0.tar.gz": fake_sdist(tmp_path / "i.tar.gz", {"qa": qa("index")}).read_bytes()})
    monkeypatch.setattr(bigbench, "INDEX", index.url)
    try:
        answer = lambda: bigbench.load_tasks(["qa"])["qa"][0]["choices"][1]  # noqa: E731
        assert answer() == "index" and index.requests == ["/simple/bigbench/", "/files/bigbench-1.0.0.tar.gz"]
        assert json.loads((cache / "bigbench" / "qa.json").read_text()) == qa("index")  # kept for the next run
        assert answer() == "index" and len(index.requests) == 2  # from the cache: the index not asked again

        package = fake_checkout(tmp_path / "site", {"qa": qa("installed")}) / "bigbench"
        (package / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(package.parent))
        monkeypatch.delitem(sys.modules, "bigbench", raising=False)
        assert answer() == "installed"

        monkeypatch.setenv(bigbench.ENV, str(fake_checkout(tmp_path / "checkout", {"qa": qa("env")})))
        assert answer() == "env"
        for given in (fake_checkout(tmp_path / "given", {"qa": qa("given")}),
                      fake_checkout(tmp_path / "given2", {"qa": qa("given")}) / "bigbench" / "benchmark_tasks"):
            assert bigbench.load_tasks(["qa"], sdist=given)["qa"][0]["choices"][1] == "given"
        assert json.loads((cache / "bigbench" / "qa.json").read_text()) == qa("index")  # a folder is read in place
        archive = fake_sdist(tmp_path / "given.tar.gz", {"qa": qa("archive")})
        assert bigbench.load_tasks(["qa"], sdist=archive)["qa"][0]["choices"][1] == "archive"
        assert json.loads((cache / "bigbench" / "qa.json").read_text()) == qa("archive")  # an archive's files kept
        assert len(index.requests) == 2
    finally:
        index.close()


def test_without_any_source_one_line_says_what_to_provide(tmp_path, monkeypatch):
    """An index that no longer lists the sdist (as one did on 2026-12-05), one that cannot be reached, a given path
    that holds no tasks: one line each, naming what to provide; nothing half-written is left in the cache."""
    from adaptguard.data import bigbench

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    index = Index({"bigbench-0.0.1.tar.gz": b"placeholder"})
    monkeypatch.setattr(bigbench, "INDEX", index.url)
    try:
        with pytest.raises(bigbench.BigBenchUnavailable) as err:
            bigbench.load_tasks(["qa"])
        assert str(err.value) == (
            f"BIG-bench's task data is not here and bigbench-1.0.0.tar.gz is not listed on {index.url}/bigbench/: "
            f"set ADAPTGUARD_BIGBENCH to a copy of bigbench-1.0.0.tar.gz, an unpacked one or a BIG-bench checkout "
            f"(github.com/google/BIG-bench), or put bigbench-1.0.0.tar.gz at "
            f"{tmp_path / 'cache' / 'downloads' / 'bigbench-1.0.0.tar.gz'}")
        with pytest.raises(bigbench.BigBenchUnavailable, match="is not listed on"):
            bigbench.load_generative_task("gen")
    finally:
        index.close()
    monkeypatch.setattr(bigbench, "INDEX", index.url)  # closed: nothing listens there now
    with pytest.raises(bigbench.BigBenchUnavailable, match=r"^BIG-bench's task data is not here and the package "
                       r"index http://127\.0\.0\.1:\d+/simple cannot be reached \(.*\): set ADAPTGUARD_BIGBENCH to"):
        bigbench.load_tasks(["qa"])
    assert not any((tmp_path / "cache" / "downloads").iterdir())
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(bigbench.ENV, str(tmp_path / "empty"))
    with pytest.raises(bigbench.BigBenchUnavailable, match="empty: holds no BIG-bench tasks"):
        bigbench.load_tasks(["qa"])
