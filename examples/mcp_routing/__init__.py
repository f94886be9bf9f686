"""An MCP server whose background workers update routing rules through fenceproxy."""
