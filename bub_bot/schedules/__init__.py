"""Schedules: jobs that make a session do something at a time.

- `times`: when a job is due (a one-off time, or a five-field cron expression in an IANA
  zone with its DST rules), checked as people and the model give it.
- `kinds`: what a kind of job is (what it stores, the entry it makes when due): the timer
  that fires jobs (`bub_bot/runtime/timer.py`) knows kinds only through this.
- `prompts`: the kind users make (`schedule.add`, `/schedules`): a prompt that comes back
  into its conversation as a scheduled message.
- `book`: adding, listing and removing a conversation's prompt jobs, with their limits.

Nothing is imported here, so `config` can use `times` without importing the rest.
"""
