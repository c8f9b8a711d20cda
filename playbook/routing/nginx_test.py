"""``nginx -t`` on the rendered router: a whole standalone configuration in a temporary directory,
checked by the nginx of this host, so that ``specguard check`` finds what nginx itself would refuse
before a reload does."""

from __future__ import annotations

import glob
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specguard.config.routing import RoutingConfig
from specguard.playbook.routing.render import DEBIAN_MODULES, MODULES, Standalone, nginx_command, render

TIMEOUT = 30.0
# Where Debian's lua-cjson puts the module LuaJIT loads (OpenResty, with Lua compiled in, has its own).
CJSON = ("/usr/lib/*/lua/5.1/cjson.so", "/usr/lib/lua/5.1/cjson.so", "/usr/local/lib/lua/5.1/cjson.so")


@dataclass(frozen=True)
class NginxTest:
    ok: bool
    detail: str  # nginx's version on success, what it said on failure


def lua_modules(binary: str) -> Path | str | None:
    """Where load_module finds the Lua module (None: compiled into nginx, as in OpenResty), or a
    string saying why this nginx cannot run the router (no Lua module, no lua-cjson)."""
    try:
        built = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=TIMEOUT).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {binary} -V: {exc}"
    if "lua-nginx-module" in built or "lua_nginx_module" in built:
        return None
    if not all((DEBIAN_MODULES / module).is_file() for module in MODULES):
        return "nginx has no Lua module: install libnginx-mod-http-lua (and lua-cjson)"
    if not any(glob.glob(pattern) for pattern in CJSON):
        return "lua-cjson is not installed: install lua-cjson"
    return DEBIAN_MODULES


def nginx_test(routing: RoutingConfig, source: str, binary: str | None = None) -> NginxTest | None:
    """What ``nginx -t`` says of the rendered router; None when nginx is not installed here."""
    binary = binary or shutil.which("nginx")
    if binary is None:
        return None
    modules = lua_modules(binary)
    if isinstance(modules, str):
        return NginxTest(False, modules)
    with tempfile.TemporaryDirectory(prefix="specguard-nginx-t-") as tmp:
        out = Path(tmp)
        render(routing, out, source, Standalone(modules=modules))
        args = nginx_command(binary, out, "-t", "-q")
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return NginxTest(False, f"nginx -t did not finish: {exc}")
        said = " ".join(done.stderr.replace(str(out), "<rendered>").split())
        if done.returncode != 0:
            return NginxTest(False, said or f"nginx -t exited with {done.returncode}")
        version = subprocess.run(
            [binary, "-v"], capture_output=True, text=True, timeout=TIMEOUT
        ).stderr.strip()
        return NginxTest(True, version.removeprefix("nginx version: ") or "nginx")
