"""The shared gathering list of a Redis broker: the two scripts that append to it and take from
it, each one step no other process can split, and the reading of an event key it holds.

The API processes gather small sends into one list on the broker, so a slice fills at the rate
of all of them together (``judge_queue`` says why gathering pays).
"""

from __future__ import annotations

# The gathering list KEYS[1] holds fewer than a slice of event keys between appends, and
# KEYS[2] the time (Redis's own clock, ms) its oldest one arrived: a timer sends them once they
# have waited ``gather_seconds``, not ``gather_seconds`` after whichever append armed it.
#
# Appends the event keys ARGV[2..] and takes from the head every whole slice of ARGV[1] events the
# list then holds, in one step no other process can split: {events left gathering, keys taken}.
# The list held less than a slice and an append is less than one, so what is left after a take
# arrived with this append: its time is now.
GATHER_SCRIPT = """
local now = redis.call('TIME')
now = now[1] * 1000 + math.floor(now[2] / 1000)
local held = redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
local size = tonumber(ARGV[1])
local whole = held - held % size
if whole == 0 then
  if held == #ARGV - 1 then redis.call('SET', KEYS[2], now) end
  return {held, {}}
end
local taken = redis.call('LRANGE', KEYS[1], 0, whole - 1)
redis.call('LTRIM', KEYS[1], whole, -1)
if held > whole then redis.call('SET', KEYS[2], now) else redis.call('DEL', KEYS[2]) end
return {held - whole, taken}
"""
# A timer's take: up to ARGV[1] event keys once the oldest has waited ARGV[2] ms, else nothing
# and how many ms are left to wait: {ms left, keys taken}. A wait longer than ARGV[2] can only
# come from a clock stepped back since the arrival: taken at once, or the timer would sleep for
# as long as the step.
TAKE_SCRIPT = """
local now = redis.call('TIME')
now = now[1] * 1000 + math.floor(now[2] / 1000)
local since = tonumber(redis.call('GET', KEYS[2]) or '0')
local left = since + tonumber(ARGV[2]) - now
if left > 0 and left <= tonumber(ARGV[2]) then return {left, {}} end
local taken = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #taken > 0 then redis.call('LTRIM', KEYS[1], #taken, -1) end
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[2]) end
return {0, taken}
"""
# Slices one timer's take reads at a time from the gathering list.
TAKE_SLICES = 64


def event_key(raw: bytes | str | int) -> int | None:
    """An event key as the gathering list holds it (bytes of its decimal), or None."""
    if isinstance(raw, int):
        return raw
    try:
        return int(raw)
    except ValueError:
        return None
