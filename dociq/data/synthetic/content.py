"""What the synthetic pages say: Faker text for titles, paragraphs, forms, tables and stamps.

One Faker per process, re-seeded per page (`seed_instance` is ~10 us; building a Faker is ~30 ms),
so a page's text depends only on its seed, never on which worker or in which order it is made.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from faker import Faker
from faker.providers.lorem.en_US import Provider as _EnglishLorem

_faker: Faker | None = None

# Faker's English lorem vocabulary, sampled with the page's random.Random: Faker's own sentence()
# costs ~40 us a word through its weighting machinery, which dominated page generation.
VOCABULARY = tuple(_EnglishLorem.word_list)


def page_faker(seed: int) -> Faker:
    """The process-wide en_US Faker, re-seeded for one page."""
    global _faker
    if _faker is None:
        _faker = Faker("en_US")
    _faker.seed_instance(seed)
    return _faker


DATE_FORMATS = ("%d/%m/%Y", "%m/%d/%Y", "%Y-%m-%d", "%B %d, %Y", "%d %b %Y")


def one_line(text: str) -> str:
    return " ".join(text.replace("\n", ", ").split())


def sentence(rng: random.Random, n_words: int) -> str:
    words = rng.choices(VOCABULARY, k=max(1, n_words))
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


def date(fake: Faker, rng: random.Random) -> str:
    return fake.date(pattern=rng.choice(DATE_FORMATS))


def amount(fake: Faker, rng: random.Random) -> str:
    value = rng.choice([rng.uniform(5, 500), rng.uniform(500, 50_000)])
    return rng.choice(["${:,.2f}", "USD {:,.2f}", "{:,.2f}"]).format(value)


def title(fake: Faker, rng: random.Random) -> str:
    kind = rng.choice(["Annual Report", "Invoice", "Application Form", "Policy Statement",
                       "Meeting Minutes", "Project Proposal", "Account Summary", "Claim Form"])
    if rng.random() < 0.5:
        return f"{fake.company()} {kind}"
    return f"{kind}: " + " ".join(w[:1].upper() + w[1:] for w in fake.catch_phrase().split())


def heading(fake: Faker, rng: random.Random, number: int) -> str:
    text = rng.choice([fake.bs().capitalize(), fake.catch_phrase(), sentence(rng, 2)[:-1]])
    return f"{number}. {text}" if rng.random() < 0.7 else text


def paragraph(fake: Faker, rng: random.Random) -> str:
    sentences = [sentence(rng, rng.randint(4, 14)) for _ in range(rng.randint(2, 5))]
    if rng.random() < 0.5:  # named entities make the reading questions depend on real content
        entity = rng.choice([fake.company(), fake.city(), fake.name()])
        sentences.insert(rng.randint(0, len(sentences)), rng.choice([
            f"The report was reviewed by {entity}.", f"Figures for {entity} rose by {rng.randint(2, 40)}%.",
            f"Payment of {amount(fake, rng)} is due on {date(fake, rng)}."]))
    return " ".join(sentences)


def list_items(fake: Faker, rng: random.Random) -> list[str]:
    return [sentence(rng, rng.randint(2, 12)) for _ in range(rng.randint(2, 5))]


# Form fields: label -> value maker. "Name" always comes first: reading questions name the person.
FORM_FIELDS = {
    "Date of birth": lambda f, r: date(f, r),
    "Address": lambda f, r: one_line(f.address()),
    "Phone": lambda f, r: f.phone_number(),
    "Email": lambda f, r: f.email(),
    "Employer": lambda f, r: f.company(),
    "Job title": lambda f, r: f.job(),
    "Policy number": lambda f, r: f"{r.choice('ABCPQX')}{r.randint(100000, 999999)}",
    "Amount due": lambda f, r: amount(f, r),
    "Start date": lambda f, r: date(f, r),
    "City": lambda f, r: f.city(),
}


@dataclass
class FormContent:
    person: str
    fields: list[tuple[str, str]]  # (label, value), the first is ("Name", person)


def form(fake: Faker, rng: random.Random, max_fields: int) -> FormContent:
    person = fake.name()
    labels = rng.sample(sorted(FORM_FIELDS), k=max(1, min(max_fields, rng.randint(3, 6))))
    if "Date of birth" not in labels and rng.random() < 0.6:
        labels[0] = "Date of birth"
    fields = [("Name", person)] + [(label, FORM_FIELDS[label](fake, rng)) for label in labels]
    return FormContent(person, fields)


@dataclass
class TableContent:
    header: list[str]  # header[0] names the row-key column
    rows: list[list[str]]  # rows[r][0] is the row key, unique within the table


def _unique(make, n: int, tries: int = 50) -> list[str]:
    seen: list[str] = []
    for _ in range(tries):
        value = make()
        if value not in seen:
            seen.append(value)
        if len(seen) == n:
            break
    return seen


TABLE_TEMPLATES = {
    "staff": (["Employee", "Department", "Start date", "Salary"],
              lambda f, r: f.first_name() + " " + f.last_name()[:1] + ".",
              [lambda f, r: r.choice(["Sales", "Finance", "Legal", "IT", "HR", "Research"]),
               lambda f, r: f.date(pattern="%d/%m/%y"),
               lambda f, r: f"${r.randint(30, 190)},{r.randint(0, 999):03d}"]),
    "invoice": (["Item", "Qty", "Unit price", "Total"],
                lambda f, r: f.word().capitalize() + " " + r.choice(["kit", "set", "pack", "unit", "part"]),
                [lambda f, r: str(r.randint(1, 40)),
                 lambda f, r: f"{r.uniform(1, 300):.2f}",
                 lambda f, r: f"{r.uniform(10, 9000):,.2f}"]),
    "branches": (["City", "Manager", "Phone", "Revenue"],
                 lambda f, r: f.city(),
                 [lambda f, r: f.last_name(),
                  lambda f, r: f"{r.randint(200, 999)}-{r.randint(1000, 9999)}",
                  lambda f, r: f"{r.uniform(0.1, 99):.1f}M"]),
    "accounts": (["Account", "Open date", "Balance", "Status"],
                 lambda f, r: f"ACC-{r.randint(1000, 9999)}",
                 [lambda f, r: f.date(pattern="%Y-%m-%d"),
                  lambda f, r: f"{r.uniform(-500, 20000):,.2f}",
                  lambda f, r: r.choice(["open", "closed", "frozen", "review"])]),
}


def table(fake: Faker, rng: random.Random, n_rows: int, n_cols: int) -> TableContent:
    header, make_key, make_cells = TABLE_TEMPLATES[rng.choice(sorted(TABLE_TEMPLATES))]
    n_cols = max(2, min(n_cols, len(header)))
    keys = _unique(lambda: make_key(fake, rng), n_rows)
    rows = [[key] + [make_cells[c](fake, rng) for c in range(n_cols - 1)] for key in keys]
    return TableContent(header[:n_cols], rows)


def header_text(fake: Faker, rng: random.Random) -> list[str]:
    left = rng.choice([fake.company(), one_line(fake.catch_phrase())])
    right = rng.choice([date(fake, rng), "Confidential", f"Ref. {fake.bothify('??-####').upper()}"])
    return [left, right] if rng.random() < 0.6 else [left]


def footer_text(fake: Faker, rng: random.Random) -> str:
    return rng.choice([fake.company() + " · " + fake.city(), "Internal use only", fake.url(), fake.email()])


def page_number_text(rng: random.Random, number: int) -> str:
    total = number + rng.randint(0, 9)
    return rng.choice([f"Page {number}", f"{number}", f"- {number} -", f"{number} / {total}", f"Page {number} of {total}"])


def stamp_lines(fake: Faker, rng: random.Random) -> list[str]:
    word = rng.choice(["PAID", "APPROVED", "RECEIVED", "COPY", "VOID", "VERIFIED"])
    return [word, fake.date(pattern="%d %b %Y").upper()] if rng.random() < 0.6 else [word]


def caption(fake: Faker, rng: random.Random, number: int) -> str:
    return f"Figure {number}. " + sentence(rng, rng.randint(3, 8))
