"""The daemon behind ``nanobot gateway``.

- ``dispatcher``: ``bus.inbound`` -> one worker per chat -> agent turns (``/stop`` here);
- ``supervisor``: adapters found by entry point, started from config, retried, their state;
- ``outbound``: the one way out, ``bus.outbound`` and recorded replies -> the channels, in
  order per chat;
- ``app``: the lifecycle (start, signals, systemd notifications, graceful stop) and
  ``Gateway.add_service`` for parts that live with it (cron, heartbeat).
"""

from nanobot.gateway.app import Gateway, Service, add_services, run_gateway
from nanobot.gateway.dispatcher import Dispatcher
from nanobot.gateway.outbound import Outbound
from nanobot.gateway.supervisor import ChannelSupervisor

__all__ = ["ChannelSupervisor", "Dispatcher", "Gateway", "Outbound", "Service", "add_services", "run_gateway"]
