"""Divisors and degree products of a GPU count, without a loop up to the count.

Layout search splits `hardware.num_gpus` into degrees. For a count such as 2**40 or
10**12 a loop over every candidate divisor (up to the count, or its square root) takes
minutes; here the count is factored (trial division by small primes, then Pollard's rho
for what is left) and everything else works on the exponents of its prime factors.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence

import numpy as np

FACTOR_LIMIT = 2**63
"""Numbers from here on are not factored: a product of two large primes would take
Pollard's rho minutes (below, at most about 2**16 steps)."""
_SMALL_PRIMES = tuple(p for p in range(2, 1000) if all(p % q for q in range(2, int(p**0.5) + 1)))
_WITNESSES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
"""Miller-Rabin bases that decide primality exactly below 3.3e24 (Sorenson and Webster
2015); above, a composite passing all of them is vanishingly unlikely."""


def _is_prime(number: int) -> bool:
    if number < 2:
        return False
    for prime in _SMALL_PRIMES:
        if number % prime == 0:
            return number == prime
    odd, twos = number - 1, 0
    while odd % 2 == 0:
        odd, twos = odd // 2, twos + 1
    for base in _WITNESSES:
        x = pow(base, odd, number)
        if x in (1, number - 1):
            continue
        for _ in range(twos - 1):
            x = x * x % number
            if x == number - 1:
                break
        else:
            return False
    return True


def _some_factor(number: int) -> int:
    """A factor of the composite `number` (no factor below 1000) other than 1 and
    itself: Pollard's rho, Floyd's cycle finding; about the fourth root of `number` steps."""
    for offset in range(1, number):
        x = y = 2
        found = 1
        while found == 1:
            x = (x * x + offset) % number
            y = (y * y + offset) % number
            y = (y * y + offset) % number
            found = math.gcd(abs(x - y), number)
        if found != number:
            return found
    raise ArithmeticError(f"no factor found for {number}")  # unreachable for composites


def prime_factors(number: int) -> dict[int, int]:
    """{prime: exponent} of `number` >= 1, primes ascending."""
    if not 1 <= number < FACTOR_LIMIT:
        raise ValueError(f"prime factors need a number from 1 to 2**63 - 1, got {number}")
    found: dict[int, int] = {}
    for prime in _SMALL_PRIMES:
        while number % prime == 0:
            found[prime] = found.get(prime, 0) + 1
            number //= prime
    pending = [number] if number > 1 else []
    while pending:
        part = pending.pop()
        if _is_prime(part):
            found[part] = found.get(part, 0) + 1
        else:
            factor = _some_factor(part)
            pending += [factor, part // factor]
    return dict(sorted(found.items()))


def divisors(number: int) -> tuple[int, ...]:
    """Every divisor of `number`, ascending."""
    found = [1]
    for prime, exponent in prime_factors(number).items():
        found = [d * prime**e for d in found for e in range(exponent + 1)]
    return tuple(sorted(found))


class DegreeProducts:
    """The ways to give each of several strategies a degree from its own list so that
    the degrees multiply to `number`, the last strategy (the fill) taking what the others
    leave: counted without listing them, and listed in order.

    Works on the grid of exponents of `number`'s prime factors: entry x of
    `ways[i]` counts the choices for strategies i, i+1, ... (the fill included) whose
    product is the divisor with exponents x. A list of every divisor of some g is a
    windowed running sum along each prime's axis; any other list adds one shifted copy
    per value, so the work grows with the grid times the lists' lengths, never with
    `number` itself.
    """

    def __init__(self, number: int, options: Mapping[str, Sequence[int]],
                 fill: Collection[int] | None):
        """`options`: each strategy's degrees to try, in order; `fill`: the degrees the
        fill may take (None: there is no fill, the others multiply to `number`)."""
        self.number = number
        factors = prime_factors(number)
        self.primes = tuple(factors)
        self.shape = tuple(e + 1 for e in factors.values()) or (1,)
        self.names = tuple(options)
        self.options = {name: tuple(v for v in dict.fromkeys(values) if number % v == 0)
                        for name, values in options.items()}
        last = np.zeros(self.shape)
        for value in (1,) if fill is None else fill:
            if value >= 1 and number % value == 0:
                last[self._exponents(value)] = 1.0
        ways = [last]
        for name in reversed(self.names):
            ways.append(self._spread(ways[-1], self.options[name]))
        self.ways = ways[::-1]
        """`ways[i]` for strategies i onwards; `ways[len(names)]`: the fill alone."""

    @property
    def count(self) -> float:
        """How many choices there are (a float: exact below 2**53)."""
        return float(self.ways[0][self._exponents(self.number)])

    def _exponents(self, value: int) -> tuple[int, ...]:
        found = []
        for prime in self.primes:
            exponent = 0
            while value % prime == 0:
                value, exponent = value // prime, exponent + 1
            found.append(exponent)
        return tuple(found) or (0,)

    def _spread(self, later: np.ndarray, values: tuple[int, ...]) -> np.ndarray:
        """Entry x: the sum of `later` at x less the exponents of each value."""
        tops = [max((self._exponents(v)[axis] for v in values), default=0)
                for axis in range(len(self.shape))]
        if values and len(values) == math.prod(t + 1 for t in tops):
            return _window_sums(later, tops)  # every divisor of one number
        found = np.zeros(self.shape)
        for value in values:
            shift = self._exponents(value)
            target = tuple(slice(s, None) for s in shift)
            source = tuple(slice(0, n - s) for n, s in zip(self.shape, shift))
            found[target] += later[source]
        return found

    def choices(self) -> Iterator[dict[str, int]]:
        """Every choice, one degree per strategy (the fill's left to the caller), with
        the first strategy's values outermost and each in its list's order."""
        if self.count:
            yield from self._from(0, self.number, {})

    def _from(self, index: int, rest: int, chosen: dict[str, int]) -> Iterator[dict[str, int]]:
        if index == len(self.names):
            yield chosen
            return
        name, later = self.names[index], self.ways[index + 1]
        for value in self.options[name]:
            if rest % value == 0 and later[self._exponents(rest // value)] > 0:
                yield from self._from(index + 1, rest // value, {**chosen, name: value})


def _window_sums(values: np.ndarray, tops: Sequence[int]) -> np.ndarray:
    """Entry x: the sum of `values` over x - t for every 0 <= t <= tops (per axis)."""
    found = values
    for axis, top in enumerate(tops):
        running = np.cumsum(found, axis=axis)
        found = running.copy()
        if top + 1 < found.shape[axis]:
            ahead = [slice(None)] * found.ndim
            behind = [slice(None)] * found.ndim
            ahead[axis] = slice(top + 1, None)
            behind[axis] = slice(0, found.shape[axis] - top - 1)
            found[tuple(ahead)] -= running[tuple(behind)]
    return found
