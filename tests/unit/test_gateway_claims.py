"""Shared gateways: the host names each project claims in a gateway's `routes/` (what
`changes` plans, and `list_script` / `change_script` run for real with `sh` against a
temporary directory), the host names and URLs a service is served at (`served.py`), and the
one reference a gateway's domain may hold (`${{ run.project_name }}`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dstack_plan.config.loader import load_project
from dstack_plan.errors import ConfigError
from dstack_plan.gateways.claims import (
    NO_ROUTES,
    ClaimChanges,
    change_script,
    changes,
    list_script,
    parse_listing,
)
from dstack_plan.gateways.handler import GatewayRecord
from dstack_plan.gateways.served import ServedBy, host_name

OWNER = "../upstream.sock"
"""The owner's claims' target (relative to `tunnels/`)."""
DIRECTORY = "/root/.dstack-plan/gateways/gw"


def never(_: str) -> bool:
    return False


def sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)


def links(routes: Path) -> dict[str, str]:
    """Host name -> target of each claim in `routes`, read directly."""
    return {p.name: os.readlink(p) for p in routes.iterdir() if p.is_symlink()}


def listed(routes: Path) -> dict[str, str]:
    """The claims as the watch sees them: `list_script` run, its output parsed."""
    done = sh(list_script(str(routes)))
    assert done.returncode == 0, done.stderr
    return parse_listing(done.stdout)


def record(**update: object) -> GatewayRecord:
    base = GatewayRecord(
        fleet="edge",
        host="10.0.0.1",
        address="203.0.113.7",
        port=443,
        domain="example.com",
        tls=True,
        directory=DIRECTORY,
        socket=f"{DIRECTORY}/upstream.sock",
    )
    return base.model_copy(update=update)


# --- parse_listing -------------------------------------------------------------------------


def test_a_listing_is_parsed_into_host_names_and_targets() -> None:
    output = "web.example.com ../upstream.sock\napi.example.com team-b.sock\n"
    assert parse_listing(output) == {
        "web.example.com": "../upstream.sock",
        "api.example.com": "team-b.sock",
    }


def test_a_listing_skips_blank_and_incomplete_lines() -> None:
    assert parse_listing("") == {}
    assert parse_listing("\nlonely\n \nweb.example.com team-b.sock\n") == {
        "web.example.com": "team-b.sock"
    }


# --- changes -------------------------------------------------------------------------------


def test_a_projects_own_claim_it_no_longer_wants_is_removed() -> None:
    claims = {"old.example.com": "team-b.sock", "web.example.com": "team-b.sock"}
    planned = changes(claims, "team-b.sock", {"web.example.com"}, never)
    assert planned == ClaimChanges(remove={"old.example.com": "team-b.sock"}, create=[], held={})


def test_wanted_names_nobody_holds_are_created_and_held_ones_kept() -> None:
    claims = {"web.example.com": "team-b.sock"}
    planned = changes(
        claims, "team-b.sock", {"web.example.com", "b.example.com", "a.example.com"}, never
    )
    assert planned.create == ["a.example.com", "b.example.com"]
    assert planned.remove == {}
    assert planned.held == {}


def test_a_name_another_project_holds_is_reported_and_not_created() -> None:
    claims = {"web.example.com": "team-c.sock", "own.example.com": "team-b.sock"}
    planned = changes(claims, "team-b.sock", {"web.example.com", "own.example.com"}, never)
    assert planned.held == {"web.example.com": "team-c.sock"}
    assert "web.example.com" not in planned.create
    assert planned.create == []
    # another project's claim is not this project's to remove
    assert planned.remove == {}


def test_the_owner_evicts_another_projects_claim_and_takes_the_name_it_wants() -> None:
    claims = {
        "web.example.com": "team-b.sock",  # team-b lost the export, owner wants the name
        "api.example.com": "team-b.sock",  # team-b lost the export, owner does not want it
        "ml.example.com": "team-c.sock",  # team-c still shares the gateway
    }
    planned = changes(
        claims,
        OWNER,
        {"web.example.com", "ml.example.com"},
        lambda target: target == "team-b.sock",
    )
    assert planned.remove == {
        "web.example.com": "team-b.sock",
        "api.example.com": "team-b.sock",
    }
    assert planned.create == ["web.example.com"]
    assert planned.held == {"ml.example.com": "team-c.sock"}


def test_nothing_changes_when_the_claims_are_already_as_wanted() -> None:
    claims = {"web.example.com": OWNER, "ml.example.com": "team-c.sock"}
    planned = changes(claims, OWNER, {"web.example.com"}, never)
    assert planned == ClaimChanges()


# --- the scripts, run with sh ----------------------------------------------------------------


def test_list_script_exits_no_routes_when_the_directory_is_missing(tmp_path: Path) -> None:
    done = sh(list_script(str(tmp_path / "routes")))
    assert done.returncode == NO_ROUTES
    assert done.stdout == ""


def test_list_script_lists_nothing_in_an_empty_routes_directory(tmp_path: Path) -> None:
    (tmp_path / "routes").mkdir()
    assert listed(tmp_path / "routes") == {}


def test_list_script_lists_only_links(tmp_path: Path) -> None:
    routes = tmp_path / "routes"
    routes.mkdir()
    os.symlink("team-b.sock", routes / "web.example.com")
    os.symlink(OWNER, routes / "api.example.com")
    (routes / "notes.txt").write_text("not a claim")
    assert listed(routes) == {"web.example.com": "team-b.sock", "api.example.com": OWNER}


def test_change_script_creates_claims_pointing_at_the_target(tmp_path: Path) -> None:
    routes = tmp_path / "routes"
    routes.mkdir()
    planned = changes({}, "team-b.sock", {"web.example.com", "api.example.com"}, never)
    done = sh(change_script(str(routes), "team-b.sock", planned))
    assert done.returncode == 0, done.stderr
    assert links(routes) == {"web.example.com": "team-b.sock", "api.example.com": "team-b.sock"}
    assert listed(routes) == links(routes)


def test_a_whole_sync_round_trip_removes_stale_and_creates_wanted(tmp_path: Path) -> None:
    routes = tmp_path / "routes"
    routes.mkdir()
    os.symlink("team-b.sock", routes / "old.example.com")
    os.symlink("team-c.sock", routes / "taken.example.com")
    wanted = {"new.example.com", "taken.example.com"}
    planned = changes(listed(routes), "team-b.sock", wanted, never)
    assert planned.held == {"taken.example.com": "team-c.sock"}
    done = sh(change_script(str(routes), "team-b.sock", planned))
    assert done.returncode == 0, done.stderr
    assert links(routes) == {
        "new.example.com": "team-b.sock",
        "taken.example.com": "team-c.sock",
    }


def test_a_removal_happens_only_while_the_link_points_where_it_did(tmp_path: Path) -> None:
    routes = tmp_path / "routes"
    routes.mkdir()
    os.symlink("team-b.sock", routes / "old.example.com")
    os.symlink("team-b.sock", routes / "moved.example.com")
    planned = changes(listed(routes), "team-b.sock", set(), never)
    assert planned.remove == {
        "old.example.com": "team-b.sock",
        "moved.example.com": "team-b.sock",
    }
    # between listing and changing, another project took moved.example.com over
    os.remove(routes / "moved.example.com")
    os.symlink("team-c.sock", routes / "moved.example.com")
    done = sh(change_script(str(routes), "team-b.sock", planned))
    assert done.returncode == 0, done.stderr
    assert links(routes) == {"moved.example.com": "team-c.sock"}


def test_an_existing_link_is_not_overwritten(tmp_path: Path) -> None:
    routes = tmp_path / "routes"
    routes.mkdir()
    planned = changes({}, "team-b.sock", {"web.example.com"}, never)
    # another project's watch claims the name between listing and changing
    os.symlink("team-c.sock", routes / "web.example.com")
    done = sh(change_script(str(routes), "team-b.sock", planned))
    assert done.returncode == 0, done.stderr
    assert links(routes) == {"web.example.com": "team-c.sock"}
    assert listed(routes) == {"web.example.com": "team-c.sock"}


def test_the_owner_evicts_and_reclaims_a_name_in_one_script(tmp_path: Path) -> None:
    routes = tmp_path / "routes"
    routes.mkdir()
    os.symlink("team-b.sock", routes / "web.example.com")
    os.symlink("team-b.sock", routes / "api.example.com")
    os.symlink("team-c.sock", routes / "ml.example.com")
    planned = changes(
        listed(routes), OWNER, {"web.example.com"}, lambda target: target == "team-b.sock"
    )
    done = sh(change_script(str(routes), OWNER, planned))
    assert done.returncode == 0, done.stderr
    assert links(routes) == {"web.example.com": OWNER, "ml.example.com": "team-c.sock"}


def test_names_and_targets_are_quoted_for_the_shell(tmp_path: Path) -> None:
    routes = tmp_path / "my routes"
    routes.mkdir()
    target = "odd $(touch pwned) name.sock"
    planned = changes({}, target, {"-web.example.com"}, never)
    done = sh(change_script(str(routes), target, planned))
    assert done.returncode == 0, done.stderr
    assert links(routes) == {"-web.example.com": target}
    assert listed(routes) == {"-web.example.com": target}
    assert not (routes / "pwned").exists()


def test_change_script_fails_when_routes_is_missing(tmp_path: Path) -> None:
    planned = changes({}, "team-b.sock", {"web.example.com"}, never)
    done = sh(change_script(str(tmp_path / "routes"), "team-b.sock", planned))
    assert done.returncode != 0
    assert not (tmp_path / "web.example.com").exists()


# --- served.py -------------------------------------------------------------------------------


def test_a_plain_domain_serves_a_run_below_it() -> None:
    assert host_name("example.com", "web", "ML_Team") == "web.example.com"


def test_a_domain_with_the_project_name_gets_the_projects_label() -> None:
    domain = "${{ run.project_name }}.example.com"
    assert host_name(domain, "web", "ML_Team") == "web.ml-team.example.com"
    assert host_name("gpu.${{run.project_name}}.example.com", "web", "p") == (
        "web.gpu.p.example.com"
    )


def test_the_owners_service_uses_the_gateways_own_socket() -> None:
    served = ServedBy(record(), "gw", None, "platform")
    assert served.socket == f"{DIRECTORY}/upstream.sock"
    assert served.claim_target == "../upstream.sock"
    assert served.fleet == "edge"
    assert served.hostname("web") == "web.example.com"
    assert served.url("web") == "https://web.example.com/"


def test_an_importers_service_uses_its_own_tunnel_socket() -> None:
    gw = record(domain="${{ run.project_name }}.example.com")
    served = ServedBy(gw, "platform/gw", "platform", "ML_Team")
    assert served.socket == f"{DIRECTORY}/tunnels/ML_Team.sock"
    assert served.claim_target == "ML_Team.sock"
    # the claim's target, relative to tunnels/, names the socket the tunnel listens on
    assert os.path.normpath(f"{DIRECTORY}/tunnels/{served.claim_target}") == served.socket
    assert served.fleet == "platform/edge"
    assert served.url("web") == "https://web.ml-team.example.com/"
    # the owner's own claim target resolves to the gateway's socket the same way
    owner = ServedBy(gw, "gw", None, "platform")
    assert os.path.normpath(f"{DIRECTORY}/tunnels/{owner.claim_target}") == owner.socket
    assert owner.url("web") == "https://web.platform.example.com/"


@pytest.mark.parametrize(
    ("tls", "port", "url"),
    [
        (True, 443, "https://web.example.com/"),
        (True, 8443, "https://web.example.com:8443/"),
        (False, 80, "http://web.example.com/"),
        (False, 8080, "http://web.example.com:8080/"),
        (False, 443, "http://web.example.com:443/"),
    ],
)
def test_a_url_leaves_out_only_its_schemes_default_port(tls: bool, port: int, url: str) -> None:
    served = ServedBy(record(tls=tls, port=port), "platform/gw", "platform", "team-b")
    assert served.url("web") == url


# --- config/gateway.py -----------------------------------------------------------------------

GATEWAY = (
    "type: gateway\nname: gw\nbackend: ssh\nfleet: onprem\ndomain: DOMAIN\n"
    "certificate: {type: file, cert: gw.crt, key: gw.key}\n"
)


def test_a_gateway_domain_may_hold_the_project_name(tmp_path: Path) -> None:
    domain = "${{ run.project_name }}.example.com"
    (tmp_path / "gw.dstack.yml").write_text(GATEWAY.replace("DOMAIN", domain))
    desired = load_project(tmp_path)
    assert desired.resources["gateway.gw"].spec.domain == domain  # type: ignore[attr-defined]


def test_a_gateway_domain_holding_a_secret_is_refused_where_it_is_written(
    tmp_path: Path,
) -> None:
    domain = "${{ secrets.X }}.example.com"
    (tmp_path / "gw.dstack.yml").write_text(GATEWAY.replace("DOMAIN", domain))
    with pytest.raises(ConfigError) as info:
        load_project(tmp_path)
    found = str(info.value)
    assert "gw.dstack.yml:5:" in found
    assert "${{ run.project_name }}" in found
    assert "${{ secrets.X }}" in found
