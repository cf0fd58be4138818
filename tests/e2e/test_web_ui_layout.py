"""The web UI's layout in a real browser (issue 35), read through the rendered DOM: at a
1280x800 window the runs table's Notes cell shows a service's long URL whole (wrapped in the
cell, not clipped by the table's scrolling box nor by the window), and the charts' axis
labels are text in the page whose boxes never overlap, the GPU utilisation axis ending at
100% (not at uPlot's padded 200). A real local agent, a real service, fake GPUs."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import test_web_ui as ui
from tests.e2e.conftest import Dstack, fake_nvidia_smi, gpu_cli
from tests.e2e.test_local_flow import wait_for_status
from tests.e2e.test_run_lifecycle import RESOURCES
from tests.e2e.test_web_api import serving

pytestmark = pytest.mark.timeout(300)

browser = ui.browser
LONG_NAME = "my-long-service-name-shown-whole-in-notes"  # the longest name allowed: 41
WATCH = ["watch", "--ui", "--bind", "127.0.0.1:0", "--interval", "0.5s"]
BUSY_GPUS = """#!/bin/sh
case "$*" in
  *memory.total,uuid*)
    echo "0, NVIDIA Fake A100, 81920, GPU-fake-0"
    echo "1, NVIDIA Fake A100, 81920, GPU-fake-1" ;;
  *utilization.gpu*)
    echo "0, 100, 1024, 81920"
    echo "1, 100, 1024, 81920" ;;
  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;
esac
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def viewport(driver: Any, width: int, height: int) -> None:
    """Give the page itself `width` x `height` CSS px. The window's size counts its frame
    (at `--window-size=1280,800` the page got 657 px) and is applied asynchronously, so the
    viewport is set through DevTools' device metrics instead: exact, and at once."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    inner = driver.execute_script("return [innerWidth, innerHeight]")
    assert inner == [width, height], f"the page got {inner}, not {width}x{height}"


def _service(name: str, port: int) -> str:
    return (
        f"type: service\nname: {name}\nport: {port}\nauth: false\nstop_duration: 1s\n"
        "commands:\n  - mkdir -p www && echo ok > www/index.html\n"
        f"  - exec python3 -m http.server {port} --bind 127.0.0.1 --directory www\n"
        f"{RESOURCES}"
    )


# Where a cell's text is drawn, against what could hide any of it: each line box of the
# text, the cell, its table's scrolling box and the window.
NOTE_GEOMETRY = """
const cell = arguments[0];
const box = cell.closest('.scroll');
const range = document.createRange();
range.selectNodeContents(cell);
const rect = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
return {
  lines: Array.from(range.getClientRects()).filter((r) => r.width > 0).map(rect),
  cell: rect(cell.getBoundingClientRect()),
  cellScroll: [cell.scrollWidth, cell.clientWidth],
  box: rect(box.getBoundingClientRect()),
  boxScroll: [box.scrollWidth, box.clientWidth],
  table: rect(cell.closest('table').getBoundingClientRect()),
  page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
};
"""


def test_a_long_service_url_in_notes_is_shown_whole_at_1280x800(
    dstack: Dstack, tmp_path: Path, cli_env: dict[str, str], browser: ui.Browser
) -> None:
    from selenium.webdriver.common.by import By

    assert len(LONG_NAME) == 41
    project = tmp_path / "project"
    (project / "web.dstack.yml").write_text(_service(LONG_NAME, _free_port()))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, f"service.{LONG_NAME}", {"running"})
    with serving(WATCH, project, cli_env) as (url, _):
        base = url.rstrip("/")
        note = f"serving {base}/proxy/services/{LONG_NAME}/"
        driver = browser(width=1280, height=800)
        driver.get(base + "/")
        viewport(driver, 1280, 800)
        row = f'#runs tr[data-run="service.{LONG_NAME}"]'
        until_note = f"the note {note!r} in the runs table"
        ui.until(lambda: note in ui.text_of(driver, row), until_note, timeout=60)
        cell = driver.find_element(By.CSS_SELECTOR, f"{row} td:last-child")
        shot = tmp_path / "runs-1280x800.png"
        driver.save_screenshot(str(shot))
        ui.screenshot(driver, "runs-long-service-url-1280x800")
        assert shot.stat().st_size > 1000

        geometry: dict[str, Any] = driver.execute_script(NOTE_GEOMETRY, cell)
        assert note in cell.text  # the whole URL, as a reader sees it (visible text only)
        cell_scroll, cell_client = geometry["cellScroll"]
        assert cell_scroll <= cell_client, f"the Notes cell clips its text: {geometry}"
        box_scroll, box_client = geometry["boxScroll"]
        assert box_scroll <= box_client + 1, f"the table scrolls, hiding columns: {geometry}"
        page_width, window_width = geometry["page"]  # the window less its scroll bar
        assert page_width <= window_width, f"the page is wider than the window: {geometry}"
        assert geometry["lines"], geometry
        for where in ("cell", "box", "table"):
            limit = geometry[where]
            for line in geometry["lines"]:
                assert limit["left"] - 0.5 <= line["left"], (where, line, geometry)
                assert line["right"] <= limit["right"] + 0.5, (where, line, geometry)
        for line in geometry["lines"]:
            assert 0 <= line["left"] and line["right"] <= window_width, (line, geometry)
    assert dstack("destroy", "-y").returncode == 0


# The axis labels of one chart as drawn: their text and boxes, and the chart's box.
AXIS_LABELS = """
const chart = document.getElementById(arguments[0]);
const rect = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
const read = (axis) => Array.from(chart.querySelectorAll('.ticks-' + axis + ' .tick'))
  .filter((e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden')
  .map((e) => ({text: e.textContent, box: rect(e.getBoundingClientRect())}));
const plot = chart.querySelector('.uplot');
return {x: read('x'), y: read('y'), chart: rect(chart.getBoundingClientRect()),
        resized: plot !== null && plot.offsetWidth <= chart.clientWidth};
"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    )


def _axes(driver: Any, chart: str, at_least: int) -> dict[str, Any]:
    """The chart's labels once it is drawn to its box's width (after a resize) with y labels
    and `at_least` x labels."""

    def drawn() -> dict[str, Any] | None:
        labels: dict[str, Any] = driver.execute_script(AXIS_LABELS, chart)
        enough = len(labels["x"]) >= at_least and labels["y"]
        return labels if enough and labels["resized"] else None

    what = f"#{chart} drawn to its width, its axis labels text in the page"
    found: dict[str, Any] = ui.until(drawn, what, timeout=60)
    return found


def _apart_and_inside(labels: dict[str, Any], where: str) -> None:
    for axis in ("x", "y"):
        ticks = labels[axis]
        for i, a in enumerate(ticks):
            assert a["text"].strip(), (where, axis, ticks)
            for b in ticks[i + 1 :]:
                assert not _overlap(a["box"], b["box"]), (where, axis, a, b)
            chart = labels["chart"]
            inside = chart["left"] - 0.5 <= a["box"]["left"] <= a["box"]["right"]
            assert inside and a["box"]["right"] <= chart["right"] + 0.5, (where, a, chart)


def test_chart_axis_labels_never_overlap_and_the_percent_axis_ends_at_100(
    tmp_path: Path, cli_env: dict[str, str], browser: ui.Browser
) -> None:
    project = tmp_path / "project"
    bin_dir = fake_nvidia_smi(tmp_path / "fake-bin", BUSY_GPUS)
    gpu_dstack = gpu_cli(cli_env, project, bin_dir)
    (project / "idle.dstack.yml").write_text(
        "type: task\nname: idle\ncommands: ['exec sleep 300']\nstop_duration: 1s\n" + RESOURCES
    )
    applied = gpu_dstack("apply", "-y")  # starts the agent that sees the busy fake GPUs
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(gpu_dstack, "task.idle", {"running"})
    with serving(WATCH, project, cli_env) as (url, _):
        base = url.rstrip("/")
        driver = browser(width=1280, height=800)
        driver.get(base + "/metrics")
        viewport(driver, 1280, 800)
        # a dozen seconds of half-second samples: a label a second would be crowded
        kept = lambda: int(ui.text_of(driver, "#live h2 small").split()[0])  # noqa: E731
        ui.until(lambda: kept() >= 24, "a dozen seconds of samples", timeout=60)
        driver.refresh()
        for width, height in ((1280, 800), (390, 844), (1280, 800)):
            viewport(driver, width, height)
            where = f"{width}x{height}"
            for chart in ("chart-gpu", "chart-queue"):
                _apart_and_inside(_axes(driver, chart, 2), f"#{chart} at {where}")
            gpu = _axes(driver, "chart-gpu", 2)
            top = min(gpu["y"], key=lambda t: t["box"]["top"])
            assert top["text"] in ("100", "100%"), (where, gpu["y"])
            values = [float(t["text"].rstrip("%")) for t in gpu["y"]]
            assert max(values) == 100 and min(values) == 0, (where, values)
            ui.screenshot(driver, f"metrics-axes-{where}")
            driver.save_screenshot(str(tmp_path / f"metrics-{where}.png"))
    assert gpu_dstack("destroy", "-y").returncode == 0
