#!/usr/bin/env python3
"""A stand-in for `systemctl` on the `sysd` SSH test host (no systemd runs in the test network).

It does the little the agent's install needs, the way systemd does it, under
`$DSTACK_PLAN_SYSTEMD_ROOT` (a directory standing in for `/`):

- `is-active [--quiet] UNIT`: `active` (exit 0) while the pid in the unit's `PIDFile=` lives,
  else `inactive` (exit 3);
- `daemon-reload`; `enable [--now] UNIT` (a `multi-user.target.wants/` link; `--now` runs the
  unit's `ExecStart=` as `Type=forking` does: with only the unit's `Environment=`, waiting
  for it to exit); `disable [--now] UNIT` (removes the link; `--now` stops it too); `stop
  UNIT` (SIGTERM to the main pid, waiting for it to go); `status UNIT`.

Every call is appended to `$ROOT/systemctl.log` as a JSON list of its arguments. The unit file
is parsed with systemd's quoting rules for what the agent's unit uses: double-quoted words with
C escapes, `%%` for `%`, and `$$` for `$` in arguments (not in the program).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(os.environ["DSTACK_PLAN_SYSTEMD_ROOT"])
UNITS = ROOT / "etc/systemd/system"
ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "s": " "}


def words(value: str) -> list[str]:
    """Split a setting's value into words, unquoting double-quoted ones."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i].isspace():
            i += 1
            continue
        word = ""
        quoted = value[i] == '"'
        i += quoted
        while i < len(value) and (quoted or not value[i].isspace()):
            c = value[i]
            if quoted and c == '"':
                i += 1
                break
            if c == "\\":
                nxt = value[i + 1]
                if nxt == "x":
                    word += chr(int(value[i + 2 : i + 4], 16))
                    i += 4
                    continue
                if nxt not in ESCAPES:
                    raise SystemExit(f"fake systemctl: bad escape \\{nxt} in {value!r}")
                word += ESCAPES[nxt]
                i += 2
                continue
            word += c
            i += 1
        out.append(word)
    return out


def specifiers(text: str) -> str:
    if "%" in text.replace("%%", ""):
        raise SystemExit(f"fake systemctl: an unescaped specifier in {text!r}")
    return text.replace("%%", "%")


def unit(name: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in (UNITS / name).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            settings[key] = value
    return settings


def main_pid(name: str) -> int | None:
    if not (UNITS / name).exists():
        return None
    try:
        pid = int(Path(specifiers(unit(name)["PIDFile"])).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError):
        return None
    return pid


def start(name: str) -> int:
    settings = unit(name)
    program, *args = words(specifiers(settings["ExecStart"]))
    argv = [program, *(a.replace("$$", "$") for a in args)]
    env = dict(w.split("=", 1) for w in words(specifiers(settings.get("Environment", ""))))
    with open(ROOT / "journal.log", "ab") as journal:
        done = subprocess.run(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=journal, stderr=journal, cwd="/"
        )
    if done.returncode != 0:
        print(f"Job for {name} failed because the control process exited with error code.")
        return 1
    return 0


def main(argv: list[str]) -> int:
    with open(ROOT / "systemctl.log", "a") as log:
        log.write(json.dumps(argv) + "\n")
    args = [a for a in argv if a not in ("--user", "--quiet", "--no-pager")]
    command, names = args[0], [a for a in args[1:] if not a.startswith("-")]
    if command == "is-active":
        active = main_pid(names[0]) is not None
        if "--quiet" not in argv:
            print("active" if active else "inactive")
        return 0 if active else 3
    if command == "daemon-reload":
        return 0
    link = UNITS / "multi-user.target.wants" / (names[0] if names else "")
    if command == "enable":
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(UNITS / names[0])
        if "--now" in argv and main_pid(names[0]) is None:
            return start(names[0])
        return 0
    if command in ("disable", "stop"):
        pid = main_pid(names[0])
        if command == "disable":
            link.unlink(missing_ok=True)
        if (command == "stop" or "--now" in argv) and pid is not None:
            os.kill(pid, signal.SIGTERM)
            while main_pid(names[0]) is not None:
                time.sleep(0.05)
        return 0
    if command == "status":
        print(f"{names[0]}: see {ROOT / 'journal.log'}", file=sys.stderr)
        return 3
    print(f"fake systemctl: {command} is not faked", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
