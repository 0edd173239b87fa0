"""The daemon behind ``nanobot gateway``.

- ``dispatcher``: ``bus.inbound`` -> one worker per chat -> agent turns (``/stop`` here);
- ``channels``: adapters found by entry point, started from config; ``bus.outbound`` -> them;
- ``app``: the lifecycle (start, signals, systemd notifications, graceful stop) and
  ``Gateway.add_service`` for parts that live with it (cron, heartbeat).
"""

from nanobot.gateway.app import Gateway, Service, add_services, run_gateway
from nanobot.gateway.channels import ChannelManager, PluginChannelConfig
from nanobot.gateway.dispatcher import Dispatcher

__all__ = ["ChannelManager", "Dispatcher", "Gateway", "PluginChannelConfig", "Service",
           "add_services", "run_gateway"]
