"""`llmpar ui`'s server and JSON API, through the standard library's HTTP client: the
page's numbers are the library's, bad specs answer with key paths, and the server keeps
to its limits (local clients, its own files, bounded bodies)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import llmpar
from llmpar.cli.main import build_parser
from llmpar.session import Session
from llmpar.ui import api, form
from llmpar.ui.server import MAX_BODY_BYTES, UiServer, make_server

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
TRAINING = EXAMPLES / "llama-3-70b-tp8-pp4-cp2.toml"
SERVING = EXAMPLES / "inference-llama-2-70b-h100.toml"


@pytest.fixture(scope="module")
def server() -> Iterator[UiServer]:
    running = make_server(Session(), {"toml": TRAINING.read_text(), "label": TRAINING.name})
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


def request(server: UiServer, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None, raw: bytes | None = None
            ) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = {"Content-Type": "application/json"} if data is not None else {}
    connection.request(method, path, body=data, headers={**sent, **(headers or {})})
    response = connection.getresponse()
    answer = response.status, dict(response.getheaders()), response.read()
    connection.close()
    return answer


def post(server: UiServer, path: str, body: Any) -> dict[str, Any]:
    status, _headers, data = request(server, "POST", path, body)
    assert status == 200, data
    answer: dict[str, Any] = json.loads(data)
    return answer


def test_the_page_and_its_files_are_served(server):
    status, headers, page = request(server, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'src="app.js"' in page and b'href="style.css"' in page
    for path, kind in (("/app.js", "text/javascript"), ("/style.css", "text/css")):
        status, headers, _ = request(server, "GET", path)
        assert status == 200 and headers["Content-Type"].startswith(kind)
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'self'" in headers["Content-Security-Policy"]


@pytest.mark.parametrize("path", ["/../pyproject.toml", "/static/../api.py", "/api.py",
                                  "/%2e%2e/%2e%2e/pyproject.toml", "/specs/examples/x.toml"])
def test_nothing_else_on_disk_is_served(server, path):
    status, _headers, _ = request(server, "GET", path)
    assert status == 404


def test_presets_list_every_kind_and_the_starting_spec(server, session):
    status, _headers, data = request(server, "GET", "/api/presets")
    listing = json.loads(data)
    assert status == 200
    assert listing["presets"]["models"] == session.presets.names("models")
    assert "llama-3-70b-tp8-pp4-cp2" in listing["presets"]["examples"]
    assert listing["initial"]["toml"] == TRAINING.read_text()
    fields = {f.key: f for f in form.walk(api.spec_form(session))
              if isinstance(f, form.FormField)}
    assert [node["key"] for node in listing["form"]] == [
        node.key for node in api.spec_form(session)]
    assert set(fields) >= {"model", "parallel.tensor.degree"}
    # Each field's help is its spec field's docstring, as in the spec reference.
    from llmpar.plan_explain import field_docs
    from llmpar.spec import Training

    tensor = session.strategies["tensor"].config_type
    assert fields["parallel.tensor.degree"].description == field_docs(tensor)["degree"] != ""
    assert fields["training.micro_batch_size"].description == (
        field_docs(Training)["micro_batch_size"])


def _schema_keys(schema: dict[str, Any], node: dict[str, Any], key: str,
                 seen: tuple[str, ...] = ()) -> Iterator[str]:
    """Every dotted key of the spec schema, tables and their keys, at any depth."""
    for part in node.get("anyOf", [node]):
        ref = part.get("$ref", "")
        name = ref.rsplit("/", 1)[-1]
        table = schema["$defs"][name] if ref else part
        if "properties" in table and name not in seen:
            for child, sub in table["properties"].items():
                if child not in ("preset", "file", "hf_config"):
                    yield f"{key}.{child}".lstrip(".")
                    yield from _schema_keys(schema, sub, f"{key}.{child}".lstrip("."),
                                            (*seen, name) if ref else seen)


def test_the_form_has_every_key_of_the_spec_schema(session):
    from llmpar.loading.json_schema import spec_json_schema

    schema = spec_json_schema(session.strategies, session.workloads)
    nodes = api.spec_form(session)
    keys = {node.key for node in form.walk(nodes)}
    fields = form.fields_by_key(nodes)
    # A value of several shapes (`search.num_gpus`: a list, or a {min, max} table) is one
    # field, typed as a TOML value.
    typed = tuple(f"{key}." for key, field in fields.items() if field.type == "toml")
    assert keys == {key for key in _schema_keys(schema, schema, "")
                    if not key.startswith(typed)} - {"version"}
    assert fields["search.num_gpus"].type == "toml"
    # Types, units, menus and defaults as the schema states them.
    assert fields["parallel.tensor.degree"].type == "integer"
    assert fields["hardware.gpu.memory_bytes"].type == "quantity"
    assert fields["hardware.gpu.memory_bytes"].unit == "bytes"
    assert fields["training.recompute"].choices == ("none", "selective", "full")
    assert fields["training.recompute"].default == "none"
    assert fields["parallel.data.fsdp"].choices == ("true", "false")
    for key, kind in (("model", "models"), ("hardware.gpu", "gpus"),
                      ("hardware.cluster", "clusters"), ("optimizer", "optimizers"),
                      ("training.framework", "frameworks"), ("inference.engine", "engines")):
        assert fields[key].type == "preset"
        assert fields[key].choices == tuple(session.presets.names(kind)) != ()
    # A table a preset fills follows its menu and holds the keys that override it.
    tables = {node.key: node for node in form.walk(nodes) if isinstance(node, form.FormTable)}
    assert tables["model"].preset == "models" and "model.num_layers" in fields
    assert "model.file" not in keys and "model.hf_config" not in keys


def test_the_server_serves_the_spec_schema_its_form_is_made_of(server):
    from llmpar.loading.json_schema import spec_json_schema

    status, _headers, data = request(server, "GET", "/api/schema")
    assert status == 200
    assert json.loads(data) == json.loads(json.dumps(spec_json_schema(
        server.session.strategies, server.session.workloads)))


def test_a_plugin_strategys_table_is_in_the_form():
    from test_search_plugins import ChunkedLossPlugin

    nodes = api.spec_form(Session(load_entry_points=False, plugins=[ChunkedLossPlugin()]))
    fields = form.fields_by_key(nodes)
    assert fields["parallel.chunked_loss.chunks"].type == "integer"
    assert fields["parallel.chunked_loss.chunks"].default == "1"


def test_a_training_plan_is_llmpar_evaluate(server):
    answer = post(server, "/api/evaluate", {"toml": TRAINING.read_text()})
    plan = llmpar.evaluate(TRAINING)
    assert answer["ok"] and answer["plan"] == json.loads(json.dumps(plan.to_dict()))
    view = answer["view"]
    memory = view["memory"]
    assert memory["total"]["value"] == plan.total_bytes
    assert memory["capacity"]["value"] == plan.capacity_bytes
    # The stacked components are the plan's own and add up to its total.
    assert sum(c["value"] for c in memory["components"]) == plan.total_bytes
    assert [s["total"]["value"] for s in memory["stages"]] == [s.total_bytes
                                                                for s in plan.stages]
    assert view["peak"]["allocated"]["value"] == plan.training.memory_peak.allocated_bytes
    assert max(m["value"] for m in view["peak"]["timeline"]) == (
        plan.training.memory_peak.allocated_bytes)
    assert view["step"]["step"]["value"] == pytest.approx(plan.step_seconds)
    # compute + exposed communication + bubble + optimizer (+ host) = the step.
    assert sum(p["value"] for p in view["step"]["parts"]) == pytest.approx(plan.step_seconds)
    assert len(view["collectives"]) == len(plan.collectives)
    run = {row["key"]: row["value"] for row in view["run"]}
    assert run["train_seconds"] == pytest.approx(plan.train_seconds)
    assert run["gpu_hours"] == pytest.approx(plan.gpu_hours)
    assert view["trust"] == plan.training.step_time_trust != ""
    assert view["tables"][0]["title"]


def test_a_run_cost_is_its_gpu_hours_at_the_stated_price(server):
    text = TRAINING.read_text().replace("num_gpus = 256", "num_gpus = 256\ngpu_hour_cost = 2.5")
    answer = post(server, "/api/evaluate", {"toml": text})
    run = {row["key"]: row["value"] for row in answer["view"]["run"]}
    assert run["run_cost"] == pytest.approx(run["gpu_hours"] * 2.5)
    # Without a price the page says which key gives one.
    unpriced = post(server, "/api/evaluate", {"toml": TRAINING.read_text()})
    cost = [row for row in unpriced["view"]["run"] if row["key"] == "run_cost"]
    assert cost == [{"label": "cost (set hardware.gpu_hour_cost)", "value": None,
                     "key": "run_cost", "text": "-"}]


def test_a_serving_plan_shows_kv_cache_and_times(server):
    answer = post(server, "/api/evaluate", {"toml": SERVING.read_text()})
    plan = llmpar.evaluate(SERVING)
    rows = {row["key"]: row["value"] for row in answer["view"]["serving"]["rows"]}
    assert answer["workload"] == "inference" and answer["view"]["step"] is None
    assert rows["kv_cache_bytes"] == plan.kv_cache_bytes
    assert rows["ttft_seconds"] == pytest.approx(plan.prefill_seconds)
    assert rows["tpot_seconds"] == pytest.approx(plan.tpot_seconds)
    assert rows["tokens_per_second_per_gpu"] == pytest.approx(plan.tokens_per_second_per_gpu)


def test_form_changes_rewrite_the_spec_and_its_plan(server):
    answer = post(server, "/api/evaluate", {"toml": TRAINING.read_text(),
                                            "changes": {"parallel.pipeline.degree": 8,
                                                        "parallel.context.degree": None}})
    plan = llmpar.evaluate(TRAINING, {"parallel.pipeline.degree": 8,
                                      "parallel.context.degree": 1})
    assert answer["ok"], answer.get("problems")
    assert answer["fields"]["parallel.pipeline.degree"] == "8"
    assert "parallel.context.degree" not in answer["fields"]
    # Keys not given show what the loaded spec holds: the preset's and the defaults.
    assert answer["effective"]["model.num_layers"] == "80"
    assert answer["effective"]["parallel.context.degree"] == "1"
    assert "degree = 8" in answer["toml"] and answer["plan"]["layout"] == plan.layout
    assert answer["plan"]["total_bytes"] == plan.total_bytes


def test_text_without_changes_is_kept_as_typed(server):
    text = TRAINING.read_text()
    assert post(server, "/api/evaluate", {"toml": text})["toml"] == text


def test_spec_errors_answer_with_their_key_paths(server):
    answer = post(server, "/api/evaluate", {"toml": TRAINING.read_text(),
                                            "changes": {"parallel.tensor.degree": 3}})
    assert not answer["ok"] and "plan" not in answer
    paths = {p["path"] for p in answer["problems"]}
    assert "$.parallel.tensor.degree" in paths
    # The text and the fields come back, so the page keeps what was typed.
    assert answer["fields"]["parallel.tensor.degree"] == "3"
    # Each problem names the form key it shows beside.
    assert {p["key"] for p in answer["problems"]} >= {"parallel.tensor.degree"}
    bad_toml = post(server, "/api/evaluate", {"toml": "model = ["})
    assert not bad_toml["ok"] and bad_toml["problems"][0]["path"] == "$"
    unknown = post(server, "/api/evaluate", {"toml": "model = '7b'\n",
                                             "changes": {"hardware.gpu.bogus": 1}})
    assert unknown["problems"] == [{"path": "$.hardware.gpu.bogus", "key": "hardware.gpu",
                                    "message": "not a field of the form"}]


def test_form_texts_are_read_as_a_spec_file_reads_them(server):
    """Text from a field: a TOML value, a size with its unit, a preset's name for a table
    that overrides its preset; every number as `llmpar.evaluate` gives it."""
    changes = {"hardware.gpu.memory_bytes": "80 GB", "training.recompute": "full",
               "parallel.data.overlap_grad_reduce": "false", "model": "llama-3-8b",
               "model.num_layers": "16", "search.micro_batch_sizes": "[1, 2]"}
    answer = post(server, "/api/evaluate", {"toml": TRAINING.read_text(),
                                            "changes": changes})
    assert answer["ok"], answer.get("problems")
    expected = llmpar.evaluate(TRAINING, {"hardware.gpu.memory_bytes": "80 GB",
                                          "training.recompute": "full",
                                          "parallel.data.overlap_grad_reduce": False,
                                          "model": {"preset": "llama-3-8b", "num_layers": 16}})
    assert answer["plan"] == json.loads(json.dumps(expected.to_dict()))
    assert answer["plan"]["capacity_bytes"] <= 80 * 10**9 < llmpar.evaluate(
        TRAINING).capacity_bytes
    assert answer["fields"]["model"] == "llama-3-8b"
    assert answer["fields"]["search.micro_batch_sizes"] == "[1, 2]"
    # Another preset keeps the table's overrides; an empty field removes its key.
    again = post(server, "/api/evaluate", {"toml": answer["toml"],
                                           "changes": {"model": "llama-3-70b",
                                                       "model.num_layers": None}})
    assert again["fields"]["model"] == "llama-3-70b" and "model.num_layers" not in (
        again["fields"])
    assert again["plan"]["total_bytes"] == post(server, "/api/evaluate", {
        "toml": TRAINING.read_text(), "changes": {
            k: v for k, v in changes.items() if not k.startswith("model")}})[
        "plan"]["total_bytes"]
    # A string key keeps the text as typed, a number typed as text is refused there.
    named = post(server, "/api/evaluate", {"toml": TRAINING.read_text(),
                                           "changes": {"hardware.source": "123",
                                                       "hardware.num_gpus": "many"}})
    assert [(p["key"], p["path"]) for p in named["problems"]] == [
        ("hardware.num_gpus", "$.hardware.num_gpus")]


@pytest.mark.parametrize("text, path", [
    ('model = { file = "/etc/hosts.toml" }\n', "$.model.file"),
    ('[model]\nhf_config = "config.json"\n', "$.model.hf_config"),
    ('[hardware.gpu]\nfile = "../gpu.toml"\n', "$.hardware.gpu.file"),
    ('[[x.y]]\na = 1\n[[x.y]]\nfile = "b.toml"\n', "$.x.y[1].file"),
])
def test_the_page_reads_no_files(server, text, path):
    answer = post(server, "/api/evaluate", {"toml": text})
    assert not answer["ok"]
    assert [p["path"] for p in answer["problems"]] == [path]
    assert "reads no files" in answer["problems"][0]["message"]


def test_examples_by_name_only(server):
    answer = post(server, "/api/example", {"name": "llama-3-70b-tp8-pp4-cp2"})
    assert answer == {"ok": True, "toml": TRAINING.read_text()}
    for name in ("../../pyproject", "/etc/passwd", 3):
        assert not post(server, "/api/example", {"name": name})["ok"]


def _search(server: UiServer, body: dict[str, Any]) -> dict[str, Any]:
    job = post(server, "/api/search", body)
    for _ in range(600):
        _status, _headers, data = request(server, "GET", f"/api/search/{job['id']}")
        state = json.loads(data)
        if state["done"]:
            result: dict[str, Any] = state["result"]
            return result
        time.sleep(0.05)
    raise AssertionError("the search did not finish")


def test_a_search_ranks_as_llmpar_search(server):
    text = TRAINING.read_text()
    result = _search(server, {"toml": text, "top": 3})
    expected = llmpar.search(api.edited(text, None)[0], top=3)
    assert result["ok"] and result["considered"] == expected.considered
    assert [r["objective"] for r in result["results"]] == pytest.approx(
        [r.objective for r in expected.results])
    assert [r["total_bytes"] for r in result["pareto"]] == [p.total_bytes
                                                            for p in expected.pareto]
    # Each row carries the spec that runs it: evaluated, it gives the row's numbers.
    best = llmpar.evaluate(text=result["results"][0]["toml"])
    assert best.step_seconds == pytest.approx(result["results"][0]["step_seconds"])


def test_a_serving_search(server):
    result = _search(server, {"toml": SERVING.read_text(), "top": 2})
    assert result["ok"] and result["workload"] == "inference"
    assert len(result["results"]) == 2
    assert result["results"][0]["layout"]


@pytest.mark.parametrize("body, path", [({"objective": "speed"}, "$.search.objective"),
                                        ({"top": 0}, "$.search.top"),
                                        ({"top": 10_000}, "$.search.top")])
def test_search_arguments_are_checked(server, body, path):
    result = _search(server, {"toml": TRAINING.read_text(), **body})
    assert not result["ok"] and result["problems"][0]["path"] == path


def test_unknown_search_is_404(server):
    assert request(server, "GET", "/api/search/nope")[0] == 404


def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    connection.putrequest("POST", "/api/evaluate")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    connection.endheaders()  # the body is never sent: the answer comes first
    response = connection.getresponse()
    assert response.status == 413 and b"at most" in response.read()
    connection.close()


def test_bodies_are_json_objects(server):
    assert request(server, "POST", "/api/evaluate", raw=b"[1, 2]")[0] == 400
    assert request(server, "POST", "/api/evaluate", raw=b"not json")[0] == 400
    status, _h, _ = request(server, "POST", "/api/evaluate", raw=b"{}",
                            headers={"Content-Type": "text/plain"})
    assert status == 415  # a plain form post from another site cannot reach the API
    assert request(server, "POST", "/api/nothing", body={})[0] == 404


def test_only_local_names_in_the_host_header(server):
    status, _h, _ = request(server, "GET", "/", headers={"Host": "attacker.example:80"})
    assert status == 403
    port = server.server_address[1]
    assert request(server, "GET", "/", headers={"Host": f"localhost:{port}"})[0] == 200


def test_remote_clients_are_refused_unless_allowed(session):
    local = make_server(session)
    remote = make_server(session, allow_remote=True)
    try:
        for srv, expected in ((local, True), (remote, False)):
            handler = object.__new__(srv.RequestHandlerClass)
            sent: list[int] = []
            handler.server = srv
            handler.client_address = ("192.0.2.7", 5000)
            handler.headers = {"Host": "192.0.2.1:8000"}  # type: ignore[assignment]
            handler._send_json = lambda data, status=200, sent=sent: sent.append(status)
            assert handler._refuse_client() is expected
            assert sent == ([403] if expected else [])
    finally:
        local.server_close()
        remote.server_close()


def test_the_server_listens_on_loopback_on_a_free_port(session):
    one, two = make_server(session), make_server(session)
    try:
        assert one.server_address[0] == "127.0.0.1" and one.server_address[1] > 0
        assert one.server_address[1] != two.server_address[1]
        assert one.url == f"http://127.0.0.1:{one.server_address[1]}/"
    finally:
        one.server_close()
        two.server_close()


def test_the_command_takes_a_spec_a_port_and_no_browser():
    args = build_parser().parse_args(["ui", str(TRAINING), "--port", "0", "--no-browser"])
    assert args.command == "ui" and args.no_browser and args.port == 0 and args.host is None


def test_the_command_starts_from_a_shipped_example(session):
    from llmpar.cli.ui import initial_spec

    assert initial_spec(session, "llama-3-70b-tp8-pp4-cp2")["toml"] == TRAINING.read_text()
    assert initial_spec(session, None) == {}
    with pytest.raises(llmpar.SpecError):
        initial_spec(session, "no-such-spec")


def test_llmpar_ui_serves_until_stopped():
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "llmpar", "ui", str(TRAINING),
                                "--no-browser"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("llmpar ui: http://127.0.0.1:"), line
        host_port = line.split("http://", 1)[1].split("/", 1)[0]
        connection = http.client.HTTPConnection(host_port, timeout=30)
        connection.request("GET", "/api/presets")
        listing = json.loads(connection.getresponse().read())
        assert listing["initial"] == {"toml": TRAINING.read_text(), "label": TRAINING.name}
        connection.close()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0


def test_an_address_in_use_is_an_error_not_a_traceback(session, capsys):
    from llmpar.cli.main import main

    taken = make_server(session)
    try:
        status = main(["ui", "--no-browser", "--port", str(taken.server_address[1])])
    finally:
        taken.server_close()
    assert status == 1
    assert "cannot listen on 127.0.0.1 port" in capsys.readouterr().err


def test_a_failure_inside_llmpar_is_answered_not_dropped(session, monkeypatch):
    running = make_server(session)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()

    def broken(*_args: object) -> dict[str, Any]:
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "evaluate", broken)
    try:
        status, _headers, data = request(running, "POST", "/api/evaluate", {"toml": ""})
        assert status == 500
        assert json.loads(data)["problems"][0]["message"] == "llmpar failed: RuntimeError('boom')"
        assert request(running, "GET", "/api/presets")[0] == 200  # still serving
    finally:
        running.shutdown()
        running.server_close()


@given(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(),
                 st.booleans(), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(min_size=1, max_size=4), st.integers(), max_size=2)))
@example(1000001.0)
@example(15e12)
def test_a_fields_text_reads_back_to_its_value(value):
    """What the form shows of a value is what it reads back when sent (a float stays a
    float, exactly)."""
    field = form.FormField(key="x.y", type="toml")
    back = form.parse_value(field, form.value_text(value))
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize("text, key", [
    ('model = "llama-3-8b"\n[hardware]\nnum_gpus = 8\n', "hardware.gpu"),
    ('model = "llama-3-8b"\n[hardware]\ngpu = "h100-sxm"\nnum_gpu = 8\n', "hardware"),
    ('model = "nope"\n[hardware]\ngpu = "h100-sxm"\n', "model"),
    ('model = "llama-3-8b"\n[hardware]\ngpu = "h100-sxm"\n[parallel.bogus]\n', "parallel"),
])
def test_a_problem_shows_beside_the_deepest_key_of_the_form_on_its_path(server, text, key):
    """A key the form has not (a misspelt key, an unknown strategy) shows at its table."""
    answer = post(server, "/api/evaluate", {"toml": text})
    assert [p["key"] for p in answer["problems"]] == [key]
