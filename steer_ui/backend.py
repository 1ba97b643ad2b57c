"""The old name of :mod:`steer_ui.service` (``Backend`` is now ``Service``), kept for one release."""
from .service import RANDOM, Frame, Service, Session, UserError

Backend = Service

__all__ = ["Backend", "Frame", "RANDOM", "Service", "Session", "UserError"]
