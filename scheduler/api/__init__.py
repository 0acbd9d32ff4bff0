"""FastAPI app of the scheduler: thin routers over :class:`scheduler.service.SchedulerService`."""

from scheduler.api.app import create_app

__all__ = ["create_app"]
