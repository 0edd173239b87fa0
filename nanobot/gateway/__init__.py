"""The daemon behind ``nanobot gateway``.

- ``dispatcher``: ``bus.inbound`` -> one worker per chat -> agent turns (``/stop`` here);
- ``supervisor``: adapters found by entry point, started from config, retried, their state;
- ``outbound``: the one way out, ``bus.outbound`` and recorded replies -> the channels, in
  order per chat;
- ``app``: the lifecycle (start, signals, systemd notifications, graceful stop), and the
  services that live with the daemon (cron, the API, the heartbeat).
"""

from nanobot.gateway.app import Gateway, Service, run_gateway
from nanobot.gateway.dispatcher import Dispatcher
from nanobot.gateway.outbound import Outbound
from nanobot.gateway.supervisor import ChannelSupervisor

__all__ = ["ChannelSupervisor", "Dispatcher", "Gateway", "Outbound", "Service", "run_gateway"]
