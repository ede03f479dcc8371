"""A small MCP server for the tests of :mod:`agentic_rag.tools.mcp`: unit conversion and physical constants.

Written with the ``mcp`` package's server API (``MCPServer``, FastMCP's 2.x successor). It speaks stdio by default
(the toolkit starts it as a child process); ``--http PORT`` serves streamable HTTP on ``http://127.0.0.1:PORT/mcp``
instead (a server the user starts). A tool that raises ``ToolError`` (an anticipated failure) answers with ``isError``
and the error's text; any other exception would reach the client as a bare "Error executing tool".
"""

from __future__ import annotations

import argparse

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# metres per unit
LENGTHS = {"m": 1.0, "km": 1000.0, "mi": 1609.344}

CONSTANTS = {
    "speed_of_light": "299792458 m/s",
    "planck": "6.62607015e-34 J s",
    "avogadro": "6.02214076e23 1/mol",
    "gravitational": "6.67430e-11 m^3 kg^-1 s^-2",
}

server = MCPServer("units", log_level="WARNING")


@server.tool()
def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a length between units (km, m, mi)."""
    for unit in (from_unit, to_unit):
        if unit not in LENGTHS:
            raise ToolError(f"unknown unit {unit!r}; known units: {', '.join(LENGTHS)}")
    return f"{value * LENGTHS[from_unit] / LENGTHS[to_unit]:g} {to_unit}"


@server.tool()
def lookup_constant(name: str) -> str:
    """Look up a physical constant by name (speed_of_light, planck, avogadro, gravitational)."""
    if name not in CONSTANTS:
        raise ToolError(f"unknown constant {name!r}; known constants: {', '.join(CONSTANTS)}")
    return CONSTANTS[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    if args.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
