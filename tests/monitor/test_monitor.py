#!/usr/bin/python3
# tests/monitor/test_monitor.py — what a run shows, checked from outside through the real binary:
# (metrics) /metrics scraped twice during a real training run passes `promtool check metrics`,
# names every metric issue 16 lists, and no counter ever goes down while the step advances;
# (dashboard) the page GET / serves, opened in headless Chromium during a run, logs no console
# error, loads nothing from another origin, draws every chart, and its step tile changes while
# the run goes on; (report) `strata report` on a run's --metrics file writes one HTML file that
# Chromium opens offline with no error and every chart drawn, showing the run's last step and
# loss; (bad_input) a port in use, a bad monitor config and a bad RUN.json each stop with one
# line and exit 2 before any work. Loopback only; every wait is bounded.
#
# Usage: test_monitor.py STRATA_BINARY CASE. Skips (77) only when promtool, chromium,
# chromedriver or python3-selenium is not installed (scripts/setup.sh installs them).
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

STRATA = os.path.abspath(sys.argv[1])
CASE = sys.argv[2]
CORPUS = "/usr/share/common-licenses/GPL-3"
REQUIRED = ["strata_step", "strata_loss", "strata_tokens_per_second", "strata_step_seconds", "strata_stall_ratio",
            "strata_tier_bytes", "strata_tier_budget_bytes", "strata_transfer_bytes_total",
            "strata_nvme_read_bytes_total", "strata_nvme_write_bytes_total", "strata_io_errors_total",
            "strata_checksum_failures_total", "strata_predicted_step_seconds", "strata_learning_rate"]


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def skip(message):
    print("SKIP: " + message, file=sys.stderr)
    sys.exit(77)


def write_config(folder, steps, **extra):
    """A tiny GPT-2 with everything on NVMe under small budgets; JSON is valid YAML."""
    nvme = os.path.join(folder, "nvme")
    os.makedirs(nvme, exist_ok=True)
    cfg = {
        "model": {"n_layer": 8, "n_head": 4, "n_embd": 64, "vocab_size": 256, "seq_len": 32, "init": "random"},
        "data": {"path": CORPUS, "format": "text-bytes"},
        "batch_size": 4,
        "steps": steps,
        "precision": "fp32",
        "device": {"kind": "cpu", "memory": "2MiB"},
        "host": {"memory": "4MiB"},
        "nvme": {"paths": [nvme]},
        "placement": {"params": "nvme", "grads": "host", "optimizer": "nvme"},
        "checkpoint_every": 5,
    }
    cfg.update(extra)
    path = os.path.join(folder, "config.yaml")
    with open(path, "w") as out:
        json.dump(cfg, out)
    return path, nvme


class ServedRun:
    """`strata train --serve 127.0.0.1:0` in the background; knows its URL once it is logged."""

    def __init__(self, folder, steps=100000):
        self.config, self.nvme = write_config(folder, steps)
        self.log_path = os.path.join(folder, "train.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen([STRATA, "train", self.config, "--serve", "127.0.0.1:0"],
                                        stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        self.url = None
        while self.url is None:
            if time.time() > deadline or self.process.poll() is not None:
                self.stop()
                fail("no 'serving metrics at' line from the run:\n" + open(self.log_path).read()[-2000:])
            match = re.search(r"serving metrics at (http://127\.0\.0\.1:\d+/)metrics", open(self.log_path).read())
            if match:
                self.url = match.group(1)
            time.sleep(0.1)

    def get(self, path):
        with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()

    def wait_for_step(self, step, timeout_s=120):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            history = json.loads(self.get("/api/history")[2])
            if history["steps"] and history["steps"][-1]["step"] >= step:
                return history
            if self.process.poll() is not None:
                fail("the run ended early:\n" + open(self.log_path).read()[-2000:])
            time.sleep(0.2)
        fail(f"step {step} not reached in {timeout_s} s")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.log.close()


def parse_exposition(text):
    """{(name, labels): value} and {name: type} from Prometheus text format."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)", line)
            if not match:
                fail(f"unparsable sample line: {line!r}")
            samples[(match.group(1), match.group(2) or "")] = float(match.group(3))
    return samples, types


def promtool_check(text):
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        fail(f"promtool check metrics: {result.stdout}{result.stderr}\n--- exposition ---\n{text}")


def case_metrics():
    if shutil.which("promtool") is None:
        skip("promtool (Debian package prometheus) is not installed")
    with tempfile.TemporaryDirectory() as folder:
        run = ServedRun(folder)
        try:
            run.wait_for_step(2)
            status, content_type, first = run.get("/metrics")
            if status != 200 or not content_type.startswith("text/plain; version=0.0.4"):
                fail(f"/metrics answered {status} {content_type!r}")
            promtool_check(first)
            a, types = parse_exposition(first)
            step_a = a[("strata_step", "")]
            run.wait_for_step(int(step_a) + 2)
            second = run.get("/metrics")[2]
            promtool_check(second)
            b, _ = parse_exposition(second)
            # the names the issue lists, with the labels it names
            names = {name for name, _ in b}
            for name in REQUIRED:
                if name not in names:
                    fail(f"/metrics lacks {name}")
            for tier in ("device", "host", "nvme"):
                for name in ("strata_tier_bytes", "strata_tier_budget_bytes"):
                    if (name, f'{{tier="{tier}"}}') not in b:
                        fail(f"/metrics lacks {name}{{tier=\"{tier}\"}}")
            # On the CPU device, device.memory beyond the kernels' scratch joins host.memory in
            # one pool (docs/train.md): the two budgets the run reports add up to the config's.
            device_budget = b[("strata_tier_budget_bytes", '{tier="device"}')]
            host_budget = b[("strata_tier_budget_bytes", '{tier="host"}')]
            if device_budget + host_budget != (2 << 20) + (4 << 20) or not 0 < device_budget <= 2 << 20:
                fail(f"budgets device {device_budget} + host {host_budget} are not the config's 2 + 4 MiB")
            if not 0 < b[("strata_tier_bytes", '{tier="host"}')] <= host_budget:
                fail("host occupancy is not within (0, budget]")
            for name, kind in types.items():
                if kind == "counter" and not name.endswith("_total"):
                    fail(f"counter {name} does not end in _total")
            # counters only grow, and the run moved on between the scrapes
            for (name, labels), value in a.items():
                if types.get(name) == "counter" and b[(name, labels)] < value:
                    fail(f"counter {name}{labels} went down: {value} → {b[(name, labels)]}")
            if not b[("strata_step", "")] >= step_a + 2:
                fail(f"strata_step did not advance: {step_a} → {b[('strata_step', '')]}")
            if not b[("strata_nvme_read_bytes_total", "")] > a[("strata_nvme_read_bytes_total", "")]:
                fail("strata_nvme_read_bytes_total did not grow while every weight streams from NVMe")
            if not 0 <= b[("strata_stall_ratio", "")] <= 1:
                fail("strata_stall_ratio is not a share")
            # /api/history?since= returns only later steps; anything else is refused
            history = json.loads(run.get(f"/api/history?since={int(step_a)}")[2])
            if not history["steps"] or min(s["step"] for s in history["steps"]) <= step_a:
                fail("/api/history?since= returned steps it was told to leave out")
            for path in ("/nope", "/../../etc/passwd", "/api/history?since=x"):
                try:
                    run.get(path)
                    fail(f"GET {path} was answered")
                except urllib.error.HTTPError as error:
                    if error.code not in (400, 404):
                        fail(f"GET {path}: {error.code}")
            request = urllib.request.Request(run.url + "metrics", data=b"x", method="POST")
            try:
                urllib.request.urlopen(request, timeout=10)
                fail("POST /metrics was accepted: the endpoint must be read-only")
            except urllib.error.HTTPError:
                pass
        finally:
            run.stop()
        print(f"ok: two scrapes at steps {int(step_a)} and {int(b[('strata_step', '')])} pass promtool; "
              f"{sum(1 for k in types.values() if k == 'counter')} counters never went down")


def browser():
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        skip("chromium or chromium-driver is not installed")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        skip("python3-selenium is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1800", "--no-first-run", "--disable-extensions",
                     "--disable-background-networking", "--proxy-server=direct://"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    return driver


def wait_until(driver, script, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.25)
    fail(f"{what} not seen within {timeout_s} s")


# Counts, per chart canvas, the pixels that are neither the white background nor the grid.
INK_SCRIPT = """
return Array.from(document.querySelectorAll('canvas[data-chart]')).map(function (c) {
  var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, ink = 0;
  for (var i = 0; i < d.length; i += 4) {
    var r = d[i], g = d[i + 1], b = d[i + 2];
    if (Math.max(r, g, b) - Math.min(r, g, b) > 60) ink++;   // coloured: a series line, not grey axes
  }
  return [c.getAttribute('data-chart'), ink];
});
"""


def check_page(driver, origin):
    charts = driver.execute_script(INK_SCRIPT)
    if len(charts) != 8:  # loss, learning rate, tokens/s, step time, stall, occupancy, bandwidth, NVMe written
        fail(f"expected 8 charts, found {len(charts)}")
    for name, ink in charts:
        if ink < 50:
            fail(f"chart {name} has no series drawn ({ink} coloured pixels)")
    errors = [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]
    if errors:
        fail(f"console errors: {errors}")
    resources = driver.execute_script(
        "return performance.getEntriesByType('resource').map(function (e) { return e.name; });")
    for url in resources:
        if origin is None or not url.startswith(origin):
            fail(f"the page loaded {url}: it must need nothing from anywhere else")
    return charts


def case_dashboard():
    driver = browser()
    with tempfile.TemporaryDirectory() as folder:
        run = ServedRun(folder)
        try:
            run.wait_for_step(1)
            driver.get(run.url)
            wait_until(driver, "var r = document.getElementById('strata-root');"
                               "return r && r.getAttribute('data-charts-drawn') === '8';", 60, "eight drawn charts")
            first = driver.execute_script("return document.querySelector('#tile-step .strata-tile-value').textContent;")
            # the page polls every second; the run takes well under that per step
            changed = wait_until(
                driver, "var v = document.querySelector('#tile-step .strata-tile-value').textContent;"
                        f"return v !== {json.dumps(first)} ? v : null;", 60, "the step tile changing")
            check_page(driver, run.url.rstrip("/"))
            state = driver.execute_script("return document.querySelector('#tile-state .strata-tile-value').textContent;")
            if state != "running":
                fail(f"the state tile says {state!r} during the run")
        finally:
            driver.quit()
            run.stop()
    print(f"ok: dashboard drew 8 charts with no console error; step tile {first!r} → {changed!r}")


def case_report():
    with tempfile.TemporaryDirectory() as folder:
        config, _ = write_config(folder, 6)
        run_json = os.path.join(folder, "run.json")
        result = subprocess.run([STRATA, "train", config, "--metrics", run_json], capture_output=True, text=True,
                                timeout=240)
        if result.returncode != 0:
            fail(f"train: {result.stderr[-2000:]}")
        report = os.path.join(folder, "report.html")
        result = subprocess.run([STRATA, "report", run_json, "--out", report], capture_output=True, text=True,
                                timeout=60)
        if result.returncode != 0:
            fail(f"report: {result.stderr}")
        html = open(report).read()
        if re.search(r"(src|href)\s*=|https?://|@import|url\(", html):
            fail("the report refers to something outside itself")
        with open(run_json) as f:
            steps = json.load(f)["steps"]
        for key in ("device_bytes", "host_bytes", "nvme_bytes"):
            if not all(key in s for s in steps):
                fail(f"RUN.json steps lack {key}")
        driver = browser()
        try:
            driver.get("file://" + report)
            wait_until(driver, "var r = document.getElementById('strata-root');"
                               "return r && r.getAttribute('data-charts-drawn') === '8';", 60, "eight drawn charts")
            check_page(driver, None)
            step = driver.execute_script("return document.querySelector('#tile-step .strata-tile-value').textContent;")
            loss = driver.execute_script("return document.querySelector('#tile-loss .strata-tile-value').textContent;")
        finally:
            driver.quit()
        if step != "6 / 6":
            fail(f"the report's step tile reads {step!r}, not '6 / 6'")
        if abs(float(loss) - steps[-1]["loss"]) > 1e-3:
            fail(f"the report's loss tile reads {loss}, RUN.json's last loss is {steps[-1]['loss']}")
    print(f"ok: report of 6 steps opens offline with 8 charts, no console error; last loss {loss}")


def expect_refusal(args, needle, what):
    result = subprocess.run([STRATA] + args, capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode != 2:
        fail(f"{what}: exit {result.returncode}, expected 2\n{result.stderr}")
    if len(lines) != 1 or needle not in lines[0]:
        fail(f"{what}: expected one line naming {needle!r}, got:\n{result.stderr}")


def case_bad_input():
    with tempfile.TemporaryDirectory() as folder:
        config, nvme = write_config(folder, 3)
        # a port in use: refused before any training work (no store created)
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        expect_refusal(["train", config, "--serve", f"127.0.0.1:{port}"], str(port), "a port in use")
        holder.close()
        if os.listdir(nvme):
            fail(f"a refused run left {os.listdir(nvme)} in the store folder")
        expect_refusal(["train", config, "--serve", "localhost:http"], "--serve", "a non-numeric port")
        bad, _ = write_config(folder, 3, monitor={"serve": "127.0.0.1:99999"})
        expect_refusal(["train", bad], "monitor.serve", "monitor.serve out of range")
        bad, _ = write_config(folder, 3, monitor={"port": 9000})
        expect_refusal(["train", bad], "monitor.port", "an unknown monitor key")
        # bad RUN.json files: one line, exit 2, no output written
        out = os.path.join(folder, "report.html")
        expect_refusal(["report", os.path.join(folder, "missing.json"), "--out", out], "missing.json", "a missing RUN.json")
        for name, text, needle in (("garbage.json", "{not json", "not valid JSON"),
                                   ("nosteps.json", '{"summary": {}}', "'steps'"),
                                   ("badstep.json", '{"steps": [{"step": 1, "loss": "x", "seconds": 1}]}', "'loss'")):
            path = os.path.join(folder, name)
            with open(path, "w") as f:
                f.write(text)
            expect_refusal(["report", path, "--out", out], needle, name)
        if os.path.exists(out):
            fail("a refused report wrote its output file")
    print("ok: a port in use, bad monitor keys and bad RUN.json files each give one line and exit 2")


{"metrics": case_metrics, "dashboard": case_dashboard, "report": case_report, "bad_input": case_bad_input}[CASE]()
