"""Scheduled health alerts and reports in #infra: the rules (Alertmanager's: fire after a streak, one
message per cluster and problem edited as it evolves, repeat, resolve, silence), the monitor that runs
them on the bot's loop, and the daily summary's chart. Transport-free, like the protocol engine."""
