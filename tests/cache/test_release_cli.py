"""`enginefarm release`, run as docs/releases.md ("Releases (signed channels)") tells a new maintainer to."""

from __future__ import annotations

import json
import shutil
import stat

import numpy as np

from enginefarm.cache.stores import open_store
from tests.releases import artifact


def test_the_documented_release_flow(tmp_path, cli):
    store = tmp_path / "engines"
    opened = open_store(store)
    fp32 = artifact(opened, tmp_path, "fp32")
    fp16 = artifact(opened, tmp_path, "fp16", precision="fp16", p50=0.001)
    keys, release, ci = tmp_path / "ef-keys", tmp_path / "ef-release", tmp_path / "ci-keys"
    s = ("--channel", "stable", "--store", str(store))

    init = cli(
        "release", "init", *s, "--keys", str(keys), "--threshold", "root=2", "--expires", "timestamp=2d", check=True
    )
    assert "root      2 of 2 key(s)" in init.stdout
    cli("release", "export-root", *s, "--out", str(tmp_path / "root.json"), check=True)
    private = sorted(keys.glob("*.key"))
    assert len(private) == 5 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in private)
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    shown = init.stdout + init.stderr + (tmp_path / "root.json").read_text()
    assert "PRIVATE" not in shown and not any(p.read_text().splitlines()[1] in shown for p in private)

    release.mkdir(mode=0o700)
    ci.mkdir(mode=0o700)
    for role in ("targets", "snapshot", "timestamp"):
        shutil.copy(next(keys.glob(f"{role}-*.key")), release)
    shutil.copy(next(keys.glob("timestamp-*.key")), ci)

    promoted = cli("release", "promote", "m/lin", "--precision", "fp32", *s, "--keys", str(release), check=True)
    assert f"promoted m/lin onnxruntime:cpu fp32 [{fp32.build_key[:12]}]" in promoted.stdout
    listing = json.loads(cli("release", "ls", *s, "--json", check=True).stdout)
    assert [t["build_key"] for t in listing["targets"]] == [fp32.build_key]
    assert listing["roles"]["root"]["threshold"] == 2 and listing["roles"]["timestamp"]["version"] == 2

    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    app = ("--store", str(store), "--channel", "stable", "--trusted-root", str(tmp_path / "root.json"))
    ran = cli("run", "m/lin", "--input", f"x={tmp_path / 'x.npy'}", *app, "--explain", check=True)
    assert (
        fp32.build_key[:12] in ran.stdout.splitlines()[-1] and "from the channel stable" in ran.stdout
    )  # fp16 is faster, but not released

    assert cli("release", "promote", "m/lin", *s, "--keys", str(ci)).stderr.startswith(
        "error: signing targets of channel stable needs 1"
    )
    cli("release", "promote", "m/lin", "--key", fp16.build_key[:8], *s, "--keys", str(release), check=True)
    assert fp16.build_key[:12] in cli("fetch", "m/lin", *app, check=True).stdout
    yanked = cli("release", "yank", "m/lin", "--key", fp16.build_key[:6], *s, "--keys", str(release), check=True)
    assert f"yanked m/lin onnxruntime:cpu fp16 [{fp16.build_key[:12]}]" in yanked.stdout
    assert fp32.build_key[:12] in cli("fetch", "m/lin", *app, check=True).stdout

    assert "renewed timestamp of stable: v5" in cli("release", "refresh", *s, "--keys", str(ci), check=True).stdout
    cli("release", "rotate", "timestamp", *s, "--keys", str(keys), check=True)
    stale = cli("release", "refresh", *s, "--keys", str(ci))
    assert (
        stale.returncode == 1
        and stale.stderr.startswith("error: signing timestamp")
        and "Traceback" not in stale.stderr
    )
    cli("release", "rotate", "root", "--threshold", "2", *s, "--keys", str(keys), check=True)
    assert len(list((keys / "retired").glob("*.key"))) == 3
    assert fp32.build_key[:12] in cli("fetch", "m/lin", *app, check=True).stdout  # the app still ships root v1

    assert cli("release", "init", *s, "--keys", str(keys)).stderr.startswith("error: channel stable already exists")
    assert cli("release", "yank", "m/lin", "--key", "ffff", *s, "--keys", str(release)).stderr.startswith(
        "error: nothing released"
    )
    assert cli("release", "init", *s, "--keys", str(keys), "--threshold", "root=zero").stderr.startswith(
        "error: threshold 'zero'"
    )
    assert (
        cli("fetch", "m/lin", "--store", str(store), "--channel", "stable")
        .stderr.strip()
        .startswith("error: channel 'stable' needs")
    )


def test_a_world_readable_key_is_refused(tmp_path, cli):
    keys = tmp_path / "keys"
    cli("release", "init", "--store", str(tmp_path / "store"), "--keys", str(keys), check=True)
    key = next(keys.glob("timestamp-*.key"))
    key.chmod(0o644)
    out = cli("release", "refresh", "--store", str(tmp_path / "store"), "--keys", str(keys))
    assert out.returncode == 1 and f"chmod 600 {key}" in out.stderr


def test_without_python_tuf_the_error_says_what_to_install(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['tuf'] = None\n"
        "import enginefarm\n"
        "from enginefarm.errors import TrustError\n"
        "try:\n"
        f"    enginefarm.load('m/lin', device='cpu', store={str(tmp_path)!r}, channel='stable', "
        f"trusted_root={str(tmp_path / 'root.json')!r})\n"
        "except TrustError as exc:\n"
        "    print(exc.hint)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "enginefarm[release]" in out.stdout, out.stderr


def test_maintainers_are_warned_before_the_root_expires(tmp_path, cli):
    """Before: no command said anything until every client stopped loading (issue 25)."""
    store = tmp_path / "engines"
    fp32 = artifact(open_store(store), tmp_path, "fp32")
    keys = tmp_path / "keys"
    s = ("--channel", "stable", "--store", str(store))
    cli("release", "init", *s, "--keys", str(keys), "--expires", "root=30d", check=True)
    for args in (
        ("ls",),
        ("promote", "m/lin", "--key", fp32.build_key[:8], "--keys", str(keys)),
        ("refresh", "--keys", str(keys)),
    ):
        proc = cli("release", *args, *s, check=True)
        warning = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
        assert (
            len(warning) == 1
            and "the root of channel stable expires on " in warning[0]
            and "(in 29 days)" in warning[0]
        ), proc.stderr
        assert "release refresh --role root" in warning[0]
    far = tmp_path / "far"
    cli("release", "init", "--channel", "stable", "--store", str(far), "--keys", str(tmp_path / "keys2"), check=True)
    assert cli("release", "ls", "--channel", "stable", "--store", str(far), check=True).stderr == ""
