"""A recording upstream for the router's tests: answers every request with who it is (the pool),
what the router told it (the X-Specguard-* headers) and a digest of the body it received, so a
test sees which pool each request reached and that the body arrived whole.

Run: python tests/routing_upstream.py NAME PORT
"""

from __future__ import annotations

import hashlib
import sys

from aiohttp import web


async def answer(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response(
        {
            "pool": request.app["name"],
            "method": request.method,
            "path": request.path,
            "class": request.headers.get("X-Specguard-Class"),
            "routed_pool": request.headers.get("X-Specguard-Pool"),
            "length": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "peer": list(request.transport.get_extra_info("peername") or ()) if request.transport else [],
        }
    )


def main() -> None:
    name, port = sys.argv[1], int(sys.argv[2])
    app = web.Application(client_max_size=64 * 2**20)
    app["name"] = name
    app.router.add_route("*", "/{tail:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
