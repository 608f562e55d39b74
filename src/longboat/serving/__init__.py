"""Serving policies over the openpi websocket protocol: the wire format, the batching server, the served-policy
contract and its adapters (an export's policy, a random stand-in), the client and the server manager."""
