"""Invented names, so that no pretrained model can know an answer without retrieving it.

Names are built from syllables drawn from a seeded RNG and are unique across the whole world
(every type shares one namespace), which keeps KG name lookup and answer matching unambiguous.
"""

from __future__ import annotations

import random

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p", "qu", "r",
           "s", "st", "t", "tr", "v", "w", "z", "th", "sh", "ch")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "x", "nd", "rk", "sk")

_CITY_PREFIX = ("", "", "", "Port ", "New ", "Lake ", "Upper ", "Saint ")
_CITY_SUFFIX = ("", "", "ford", "holm", "burg", "vale", "mouth", "stead", "haven")
_COUNTRY_SUFFIX = ("ia", "land", "ara", "or", "istan", "ovia", "enne")
_COMPANY_SUFFIX = ("Dynamics", "Labs", "Holdings", "Works", "Systems", "Foundry", "Logistics", "Textiles",
                   "Robotics", "Pharma")
_UNIVERSITY_FORMS = ("University of {x}", "{x} Institute of Technology", "{x} College", "{x} University")
_FILM_NOUNS = ("Lantern", "Harbor", "Silence", "Orchard", "Mirror", "Tide", "Ember", "Compass", "Garden",
               "Winter", "Signal", "Meridian", "Thread", "Voyage", "Archive", "Falcon")
_BOOK_FORMS = ("The {n} of {x}", "Songs of {x}", "A History of {x}", "{x}'s {n}", "Letters from {x}",
               "The Last {n}")
_INITIALS = "ABCDEFGHJKLMNPRSTVW"


class NameFactory:
    def __init__(self, rng: random.Random):
        self._rng = rng
        self._used: set[str] = set()

    def _word(self, syllables: int) -> str:
        # At least two syllables: a one-syllable name ("Gry") is a substring of many others, which
        # would make substring metrics (cover-EM) credit wrong answers.
        rng = self._rng
        parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
        return ("".join(parts) + rng.choice(_CODAS)).capitalize()

    def _unique(self, make) -> str:
        # Collisions become rare as names grow, so widen the space on each retry instead of looping
        # on a full one; at benchmark scale (~100k names) this converges in a couple of tries.
        for attempt in range(1000):
            name = make(2 + attempt // 20)
            if name not in self._used:
                self._used.add(name)
                return name
        raise RuntimeError("name space exhausted")

    def person(self) -> str:
        rng = self._rng
        return self._unique(
            lambda n: f"{self._word(2)} {rng.choice(_INITIALS)}. {self._word(max(2, n))}"
        )

    def city(self) -> str:
        rng = self._rng
        return self._unique(lambda n: f"{rng.choice(_CITY_PREFIX)}{self._word(n)}{rng.choice(_CITY_SUFFIX)}")

    def country(self) -> str:
        rng = self._rng
        return self._unique(lambda n: self._word(n) + rng.choice(_COUNTRY_SUFFIX))

    def company(self) -> str:
        rng = self._rng
        return self._unique(lambda n: f"{self._word(n)} {rng.choice(_COMPANY_SUFFIX)}")

    def university(self) -> str:
        rng = self._rng
        return self._unique(lambda n: rng.choice(_UNIVERSITY_FORMS).format(x=self._word(n)))

    def film(self) -> str:
        rng = self._rng
        return self._unique(lambda n: f"The {self._word(n)} {rng.choice(_FILM_NOUNS)}")

    def book(self) -> str:
        rng = self._rng
        return self._unique(
            lambda n: rng.choice(_BOOK_FORMS).format(x=self._word(n), n=rng.choice(_FILM_NOUNS))
        )

    def event(self) -> str:
        rng = self._rng
        return self._unique(lambda n: f"The {self._word(n)} {rng.choice(('Festival', 'Summit', 'Exhibition', 'Regatta', 'Congress'))}")

    def reserve(self, name: str) -> bool:
        """Claim an extra string (an alias) if free; aliases must not collide with any name."""
        if name in self._used:
            return False
        self._used.add(name)
        return True
