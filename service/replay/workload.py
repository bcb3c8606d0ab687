"""A synthetic BEIR dataset, so the monitor can be shown working without downloading anything.

The world is invented: towns, household appliances and chemical compounds with made-up names and
attributes. Every attribute has one answer passage; questions about it come in four kinds, chosen so
a lexical retriever gets a realistic mix of hits and misses:

- ``direct``: the entity's name and the answer passage's own words; BM25 nearly always finds it.
- ``paraphrase``: the name with synonyms the answer passage does not use, while hard negatives about
  the same entity (and generic passages) do; the answer often drops in rank or out of the top 10.
- ``descriptive``: the entity is described by other attributes instead of named, so the words that
  match belong to the wrong passages; usually a miss.
- ``list``: one question, several answer passages (e.g. every town on one river).

Each entity also has an overview passage that restates some attributes; it is graded 1 (partly
relevant) beside the answer passage's 2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

# The invented name syllables run out a little beyond this.
MAX_QUERIES = 2000
_KIND_WEIGHTS = {"direct": 0.45, "paraphrase": 0.30, "descriptive": 0.15}
_LIST_SHARE = 0.10

# fmt: off
_FIRST_NAMES = (
    "Ada", "Bruno", "Clara", "Dmitri", "Edith", "Felix", "Greta", "Hugo", "Ilse", "Jonas", "Karin",
    "Leon", "Mira", "Nils", "Olga", "Pavel", "Rosa", "Stefan", "Tilda", "Viktor", "Wanda", "Yusuf",
)
_SURNAME_HEADS = (
    "Mar", "Bel", "Cor", "Dan", "Ell", "Fen", "Gar", "Hal", "Ker", "Lin", "Mor", "Nor", "Pell",
    "Rav", "Sor", "Tamb", "Vell", "Wyn",
)
_SURNAME_TAILS = ("row", "ford", "ling", "ski", "wick", "ton", "sen", "holm", "ard", "ley")
_TOWN_HEADS = (
    "Var", "Bel", "Cor", "Dun", "Ester", "Hal", "Kel", "Lor", "Mar", "Nor", "Ost", "Pel", "Quen",
    "Ros", "Sel", "Tor", "Ul", "Wen", "Ash", "Brom",
)
_TOWN_MIDS = ("", "a", "en", "il", "or", "um")
_TOWN_TAILS = (
    "holt", "brook", "mere", "wick", "stead", "ford", "by", "ton", "dale", "haven", "moor", "field",
)
_BRAND_HEADS = (
    "Orl", "Vex", "Kast", "Lum", "Brav", "Zen", "Tor", "Quill", "Ferr", "Nox", "Aur", "Syl",
)
_BRAND_MIDS = ("", "a", "el", "ir")
_BRAND_TAILS = ("an", "ix", "o", "era", "ova", "um", "eon", "is")
_COMPANY_SUFFIXES = (" Mills", " Group", " Works")
_COMPOUND_HEADS = (
    "vel", "mor", "tal", "ser", "quin", "dor", "phen", "lux", "cal", "thyr", "ben", "gal",
)
_COMPOUND_MIDS = ("", "or", "an", "il", "et")
_COMPOUND_TAILS = ("ane", "ine", "ol", "ide", "ate", "one", "ium", "azole")
_FESTIVAL_PARTS = (_COMPOUND_HEADS, ("ara", "ina", "ova", "eta"))
# fmt: on


@dataclass(frozen=True)
class _Attribute:
    """One attribute of an entity: the answer passage and the questions that ask for it."""

    passages: tuple[str, ...]
    direct: tuple[str, ...]
    paraphrase: tuple[str, ...]


@dataclass(frozen=True)
class _Domain:
    name: str
    attributes: dict[str, _Attribute]
    overview: tuple[str, ...]
    # Attributes the overview passage restates (graded 1 for questions about them).
    overview_restates: tuple[str, ...]
    # Hard negatives: about the entity, in the words paraphrases use, but answering nothing.
    decoys: tuple[str, ...]
    fillers: tuple[str, ...]
    generic: tuple[str, ...]
    generic_titles: tuple[str, ...]
    descriptor: str
    # The attributes the descriptor gives away, never asked about descriptively.
    descriptor_attributes: tuple[str, ...]
    list_question: str
    list_attribute: str
    list_key: str


_TOWNS = _Domain(
    name="town",
    attributes={
        "population": _Attribute(
            passages=(
                "{name} has a population of {pop}, according to the {cyear} census of {region}.",
                "The {cyear} census put the population of {name} at {pop}.",
            ),
            direct=("What is the population of {ref}?", "What population does {ref} have?"),
            paraphrase=(
                "How many inhabitants does {ref} have?",
                "How many people live in {ref}?",
            ),
        ),
        "river": _Attribute(
            passages=(
                "{name} lies on the {river} river, {dist} kilometres from the sea.",
                "The {river} river passes through {name} about {dist} kilometres before the sea.",
            ),
            direct=("Which river does {ref} lie on?", "On what river is {ref}?"),
            paraphrase=(
                "What waterway flows past {ref}?",
                "Which stream runs by the houses of {ref}?",
            ),
        ),
        "founded": _Attribute(
            passages=(
                "{name} was founded in {year} by {founder}, a {trade} from {origin}.",
                "Records show that {founder}, a {trade} from {origin}, founded {name} in {year}.",
            ),
            direct=("In what year was {ref} founded?", "Who founded {ref}?"),
            paraphrase=(
                "How old is {ref}, and when did settlers first arrive?",
                "When was the first settlement at {ref} established?",
            ),
        ),
        "industry": _Attribute(
            passages=(
                "The economy of {name} depends on {industry}; the largest employer is {company}.",
                "{company}, the largest employer in {name}, leads an economy built on {industry}.",
            ),
            direct=(
                "What does the economy of {ref} depend on?",
                "Who is the largest employer in {ref}?",
            ),
            paraphrase=(
                "How do most people in {ref} earn a living?",
                "What kind of jobs do workers in {ref} have?",
            ),
        ),
        "mayor": _Attribute(
            passages=(
                "The mayor of {name} is {person}, elected in {eyear}.",
                "{person} has been mayor of {name} since the election of {eyear}.",
            ),
            direct=("Who is the mayor of {ref}?", "When was the mayor of {ref} elected?"),
            paraphrase=(
                "Who leads the town council in {ref}?",
                "Who is in charge of local government in {ref}?",
            ),
        ),
        "festival": _Attribute(
            passages=(
                "Every {month}, {name} holds the {fest} festival, known for its {feature}.",
                "The {fest} festival of {name} takes place each {month} and is known for its "
                "{feature}.",
            ),
            direct=("When does {ref} hold its festival?", "What festival is {ref} known for?"),
            paraphrase=(
                "In which month do the locals of {ref} celebrate?",
                "What celebration draws visitors to {ref} every year?",
            ),
        ),
    },
    overview=(
        "{name} is a town in {region} on the {river} river. It is known for the {fest} festival.",
        "{name}, a town in {region}, sits on the {river} river and hosts the {fest} festival.",
    ),
    overview_restates=("river", "festival"),
    decoys=(
        "Residents of {name} debated a plan for new housing; the council says more people want to "
        "live in the town than it can house, and inhabitants asked for more schools.",
        "A history society in {name} collects letters of the first settlers and of the workers "
        "who earned a living in the town, and shows them every year to visitors.",
        "Anglers in {name} say the local waterway runs too low in summer and that the stream "
        "by the houses floods in spring; local government has promised a study.",
        "Locals in {name} celebrate many small events; the town council is in charge of permits "
        "and says the jobs they create matter to the town.",
    ),
    fillers=(
        "The figures come from the provincial statistics office.",
        "The town hall keeps an archive open to the public.",
        "A regional railway line connects the town with the provincial capital.",
        "Tourism has grown steadily over the last decade.",
        "The old market square is still the centre of town life.",
    ),
    generic=(
        "A town's population is usually measured by a census held every ten years.",
        "Inhabitants of small river towns often earn a living from fishing, milling or trade.",
        "Many people who live in market towns travel to larger cities for work.",
        "The mayor chairs the town council and is elected every four or five years.",
        "Festivals held in summer draw visitors from across the province.",
        "Settlers founded many towns at river crossings where goods could be traded.",
        "A waterway that flows through a town was once its main trade route.",
        "Local government publishes the number of residents each year.",
        "The age of a town is usually dated from its first charter or settlement.",
        "Workers in rural towns often have seasonal jobs in farming or tourism.",
        "Town councils are in charge of roads, schools and local celebrations.",
        "Census records show that most towns in the region grew after the railway arrived.",
        "The economy of a river town depends on the trade its river allows.",
        "Locals often celebrate the founding of their town with a yearly festival.",
    ),
    generic_titles=("Towns of the region", "Local government", "Census methods", "Town life"),
    descriptor="the town on the {river} river founded in {year}",
    descriptor_attributes=("river", "founded"),
    list_question="Which towns lie on the {river} river?",
    list_attribute="river",
    list_key="river",
)

_PRODUCTS = _Domain(
    name="product",
    attributes={
        "price": _Attribute(
            passages=(
                "The {name} has a list price of {price} euros.",
                "At launch the list price of the {name} was set at {price} euros.",
            ),
            direct=("What is the price of the {ref}?", "What is the list price of the {ref}?"),
            paraphrase=("How much does the {ref} cost?", "How expensive is the {ref} to buy?"),
        ),
        "weight": _Attribute(
            passages=(
                "The {name} weighs {weight} kilograms without its cable.",
                "Without its cable the {name} weighs {weight} kilograms.",
            ),
            direct=(
                "How much does the {ref} weigh?",
                "What is the weight in kilograms of the {ref}?",
            ),
            paraphrase=("How heavy is the {ref}?", "Is the {ref} light enough to carry around?"),
        ),
        "warranty": _Attribute(
            passages=(
                "{brand} covers the {name} with a {years}-year warranty against defects.",
                "The {name} comes with a warranty of {years} years from {brand}.",
            ),
            direct=("How long is the warranty on the {ref}?", "What warranty does the {ref} have?"),
            paraphrase=(
                "For how many years will a faulty {ref} be repaired for free?",
                "What guarantee comes with the {ref}?",
            ),
        ),
        "power": _Attribute(
            passages=(
                "The {name} draws {watts} watts at full power.",
                "At full power the {name} draws {watts} watts.",
            ),
            direct=("How many watts does the {ref} draw?", "What is the power of the {ref}?"),
            paraphrase=(
                "How much electricity does the {ref} use?",
                "Is the {ref} energy hungry?",
            ),
        ),
        "made": _Attribute(
            passages=(
                "The {name} is made in {place}, where {brand} makes most of its appliances.",
                "{brand} makes the {name} at its plant in {place}; every unit is made there.",
            ),
            direct=("Where is the {ref} made?", "In which town does {brand} make the {ref}?"),
            paraphrase=(
                "Which factory manufactures the {ref}?",
                "Where is the {ref} produced?",
            ),
        ),
        "noise": _Attribute(
            passages=(
                "Measured at one metre, the {name} runs at {db} decibels.",
                "The {name} runs at {db} decibels when measured at one metre.",
            ),
            direct=(
                "How many decibels does the {ref} run at?",
                "What is the decibel level of the {ref}?",
            ),
            paraphrase=("How loud is the {ref}?", "Is the {ref} noisy?"),
        ),
    },
    overview=(
        "{brand} sells the {name} for {price} euros; it weighs {weight} kilograms.",
        "The {name} weighs {weight} kilograms and sells for {price} euros in {brand} shops.",
    ),
    overview_restates=("price", "weight"),
    decoys=(
        "Reviewers asked how much the {name} should cost and whether it is expensive for what it "
        "does; several said it felt heavy and loud next to rivals.",
        "Owners of the {name} report that a faulty unit is repaired under guarantee, and that the "
        "factory that manufactures it answers questions quickly.",
        "Tests of the {name} looked at how much electricity it uses, how noisy it is, and whether "
        "it is light enough to carry; results are due next month.",
        "The {name} is produced in several colours; energy hungry models were dropped from the "
        "range, and shoppers say it is easy to carry around.",
    ),
    fillers=(
        "It is sold in most large electronics stores.",
        "The box includes a short manual in six languages.",
        "A matching accessory set is sold separately.",
        "Spare parts are available for at least five years.",
        "The design won a regional industry prize.",
    ),
    generic=(
        "The price of a kitchen appliance depends on its motor and build quality.",
        "Reviewers weigh each appliance and measure how loud it is at full power.",
        "Most manufacturers cover their appliances with a warranty of one to three years.",
        "How much electricity an appliance uses is shown on its energy label in watts.",
        "Many appliances are produced in one country and assembled in another factory.",
        "A heavier appliance is usually sturdier but harder to carry around.",
        "Noisy appliances are measured in decibels at a distance of one metre.",
        "Shoppers compare how much products cost across stores before they buy.",
        "A faulty appliance under guarantee is usually repaired for free.",
        "Energy hungry appliances draw more power and cost more to run.",
        "Cheap appliances are often light, and expensive ones are often quieter.",
        "Product tests list the weight in kilograms and the list price in euros.",
    ),
    generic_titles=("Buying appliances", "Appliance tests", "Energy labels", "Consumer advice"),
    # Product questions already say "the {ref}".
    descriptor="{kind} that {brand} makes in {place}",
    descriptor_attributes=("made",),
    list_question="Which appliances does {brand} make?",
    list_attribute="made",
    list_key="brand",
)

_COMPOUNDS = _Domain(
    name="compound",
    attributes={
        "melting": _Attribute(
            passages=(
                "The melting point of {name} is {melt} degrees Celsius.",
                "{name} has a melting point of {melt} degrees Celsius.",
            ),
            direct=(
                "What is the melting point of {ref}?",
                "At how many degrees Celsius is the melting point of {ref}?",
            ),
            paraphrase=(
                "At what temperature does {ref} turn liquid?",
                "How hot must {ref} get before it becomes liquid?",
            ),
        ),
        "discovery": _Attribute(
            passages=(
                "{name} was first isolated in {year} by {chemist} at the University of {place}.",
                "{chemist} first isolated {name} in {year}, working at the University of {place}.",
            ),
            direct=("Who first isolated {ref}?", "In what year was {ref} first isolated?"),
            paraphrase=("Who discovered {ref}?", "Which scientist found {ref}?"),
        ),
        "use": _Attribute(
            passages=(
                "{name} is used as a {use} in the {sector} industry.",
                "In the {sector} industry, {name} is used as a {use}.",
            ),
            direct=("What is {ref} used as?", "In which industry is {ref} used?"),
            paraphrase=(
                "What applications does {ref} have?",
                "What is {ref} good for in practice?",
            ),
        ),
        "solubility": _Attribute(
            passages=(
                "{name} dissolves readily in {solvent} but not in water.",
                "In {solvent} {name} dissolves readily, though not in water.",
            ),
            direct=("What does {ref} dissolve in?", "Does {ref} dissolve in water?"),
            paraphrase=("Which solvent is {ref} soluble in?", "How soluble is {ref}?"),
        ),
        "toxicity": _Attribute(
            passages=(
                "{name} is toxic: a dose of {dose} milligrams per kilogram can be lethal.",
                "A lethal dose of {name} is about {dose} milligrams per kilogram; it is toxic.",
            ),
            direct=("Is {ref} toxic?", "What dose of {ref} is lethal?"),
            paraphrase=(
                "Is {ref} dangerous to handle?",
                "How poisonous is {ref}?",
            ),
        ),
        "appearance": _Attribute(
            passages=(
                "Pure {name} forms {colour} {shape} crystals.",
                "Crystals of pure {name} are {colour} and {shape}.",
            ),
            direct=("What colour are crystals of {ref}?", "What crystals does {ref} form?"),
            paraphrase=("What does {ref} look like?", "How can {ref} be recognised by eye?"),
        ),
    },
    overview=(
        "{name} is a compound used as a {use}. It was first isolated by {chemist}.",
        "{name}, first isolated by {chemist}, is a compound used as a {use}.",
    ),
    overview_restates=("use", "discovery"),
    decoys=(
        "Safety sheets for {name} say it can be dangerous to handle and ask whether it is "
        "poisonous; gloves are advised and tests continue.",
        "A review of {name} asks which scientist discovered it and what applications it has "
        "beyond the laboratory, and how soluble it is.",
        "Students who look at samples of {name} learn how it can be recognised by eye and at what "
        "temperature it turns liquid when heated.",
        "The {name} story is one of a scientist who found a compound good for little in practice "
        "until solvent makers became interested.",
    ),
    fillers=(
        "Samples are stored in sealed glass bottles.",
        "The result has been repeated in several laboratories.",
        "Its structure was confirmed by X-ray diffraction.",
        "Industrial production began some decades later.",
        "It is listed in the major chemical handbooks.",
    ),
    generic=(
        "The melting point of a compound is the temperature at which it turns liquid.",
        "Many organic compounds dissolve in ethanol or acetone but not in water.",
        "Compounds are classed as toxic when a small dose is poisonous or lethal.",
        "Chemists who first isolate a compound often name it after a place or a plant.",
        "Crystals of a pure compound have a characteristic colour and shape.",
        "Applications of new compounds range from dyes to solvents and coatings.",
        "Handling dangerous chemicals requires gloves and a fume hood.",
        "A scientist who discovered a compound is usually credited in its handbook entry.",
        "How soluble a compound is depends on the solvent and the temperature.",
        "Compounds used in industry are tested for how toxic they are to workers.",
        "Samples can often be recognised by eye from the colour of their crystals.",
        "Heating a solid compound above its melting point makes it liquid.",
    ),
    generic_titles=("Chemistry basics", "Laboratory safety", "Industrial chemistry", "Handbooks"),
    descriptor="the compound {chemist} isolated in {year}",
    descriptor_attributes=("discovery",),
    list_question="Which compounds did {chemist} first isolate?",
    list_attribute="discovery",
    list_key="chemist",
)

_DOMAINS = (_TOWNS, _PRODUCTS, _COMPOUNDS)


@dataclass
class _Entity:
    domain: _Domain
    values: dict[str, str]
    fact_doc: dict[str, int] = field(default_factory=dict)
    overview_doc: int = -1


@dataclass(frozen=True)
class _Query:
    text: str
    kind: str
    domain: str
    relevant: dict[int, int]


class _Names:
    """Coins made-up names, each used once."""

    def __init__(self, rng: Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def coin(self, *parts: Sequence[str], capitalize: bool = True) -> str:
        for _ in range(1000):
            name = "".join(self._rng.choice(part) for part in parts)
            name = name[0].upper() + name[1:] if capitalize else name
            if name not in self._used:
                self._used.add(name)
                return name
        raise RuntimeError("ran out of invented names; add syllables")

    def person(self) -> str:
        return self.coin([f"{first} " for first in _FIRST_NAMES], _SURNAME_HEADS, _SURNAME_TAILS)


def generate_workload(out_dir: Path, n_queries: int = 200, seed: int = 7) -> Path:
    """Write a synthetic BEIR dataset (corpus, queries, test qrels) to ``out_dir``; return it."""
    if not 1 <= n_queries <= MAX_QUERIES:
        raise ValueError(f"n_queries must be between 1 and {MAX_QUERIES}, got {n_queries}")
    rng = Random(seed)
    names = _Names(rng)
    entities = _invent_entities(rng, names, n_entities=max(6, (n_queries + 1) // 2))
    passages = _write_passages(rng, entities)
    queries = _ask_questions(rng, entities, n_queries)

    # Shuffled so a document id says nothing about which entity or attribute it belongs to.
    order = list(range(len(passages)))
    rng.shuffle(order)
    doc_ids = {position: f"doc-{rank:05d}" for rank, position in enumerate(order, start=1)}

    out_dir = Path(out_dir)
    (out_dir / "qrels").mkdir(parents=True, exist_ok=True)
    with (out_dir / "corpus.jsonl").open("w", encoding="utf-8", newline="\n") as corpus:
        for position in order:
            title, text = passages[position]
            corpus.write(
                json.dumps({"_id": doc_ids[position], "title": title, "text": text}) + "\n"
            )
    with (out_dir / "queries.jsonl").open("w", encoding="utf-8", newline="\n") as queries_file:
        for number, query in enumerate(queries, start=1):
            record = {
                "_id": f"q-{number:04d}",
                "text": query.text,
                "metadata": {"kind": query.kind, "domain": query.domain},
            }
            queries_file.write(json.dumps(record) + "\n")
    with (out_dir / "qrels" / "test.tsv").open("w", encoding="utf-8", newline="\n") as qrels:
        qrels.write("query-id\tcorpus-id\tscore\n")
        for number, query in enumerate(queries, start=1):
            for position, grade in sorted(query.relevant.items(), key=lambda kv: doc_ids[kv[0]]):
                qrels.write(f"q-{number:04d}\t{doc_ids[position]}\t{grade}\n")
    return out_dir


def _invent_entities(rng: Random, names: _Names, n_entities: int) -> list[_Entity]:
    per_domain = [n_entities // 3 + (1 if i < n_entities % 3 else 0) for i in range(3)]
    towns = [names.coin(_TOWN_HEADS, _TOWN_MIDS, _TOWN_TAILS) for _ in range(per_domain[0])]
    # Outside places (founders' origins, factories, universities) that have no passages.
    places = [names.coin(_TOWN_HEADS, _TOWN_MIDS, _TOWN_TAILS) for _ in range(8)]
    regions = [f"{names.coin(_TOWN_HEADS, _TOWN_TAILS)} province" for _ in range(4)]
    # About three entities share each list key, so list questions have several answers.
    rivers = [
        names.coin(_TOWN_HEADS, _TOWN_MIDS, ("a", "e", "in", "on"))
        for _ in range(_groups(per_domain[0]))
    ]
    brands = [
        names.coin(_BRAND_HEADS, _BRAND_MIDS, _BRAND_TAILS) for _ in range(_groups(per_domain[1]))
    ]
    chemists = [names.person() for _ in range(_groups(per_domain[2]))]

    entities: list[_Entity] = []
    for i, town in enumerate(towns):
        values = {
            "name": town,
            "region": rng.choice(regions),
            "river": rivers[i % len(rivers)],
            "dist": str(rng.randrange(3, 240)),
            "pop": f"{rng.randrange(800, 250_000):,}",
            "cyear": str(rng.choice((2011, 2016, 2021))),
            "year": str(rng.randrange(1120, 1890)),
            "founder": names.person(),
            "trade": rng.choice(("miller", "merchant", "fisherman", "weaver", "smith", "monk")),
            "origin": rng.choice([*places, *towns[:i]]),
            "industry": rng.choice(
                ("timber", "fishing", "wine making", "tourism", "paper mills", "salt mining")
            ),
            "company": names.coin(_BRAND_HEADS, _BRAND_MIDS, _BRAND_TAILS, _COMPANY_SUFFIXES),
            "person": names.person(),
            "eyear": str(rng.randrange(2012, 2024)),
            "month": rng.choice(("March", "May", "June", "August", "September", "October")),
            # Festival names may repeat between towns; only the town tells them apart.
            "fest": "".join(rng.choice(part) for part in _FESTIVAL_PARTS).capitalize(),
            "feature": rng.choice(("lantern parade", "boat race", "cheese market", "folk music")),
        }
        entities.append(_Entity(_TOWNS, values))
    kinds = ("kettle", "blender", "toaster", "air purifier", "coffee grinder", "desk lamp", "fan")
    models = [f"{letter}{digit}" for letter in "KXSM" for digit in range(1, 10)]
    for i in range(per_domain[1]):
        brand = brands[i % len(brands)]
        kind = rng.choice(kinds)
        # Model codes repeat across brands, as they do in real catalogues.
        full = names.coin((f"{brand} ",), models, (f" {kind}",), capitalize=False)
        values = {
            "name": full,
            "brand": brand,
            "kind": kind,
            "price": str(rng.randrange(19, 400)),
            "weight": f"{rng.uniform(0.4, 6.0):.1f}",
            "years": str(rng.choice((1, 2, 3, 5))),
            "watts": str(rng.randrange(8, 2400, 10)),
            "place": rng.choice(places),
            "db": str(rng.randrange(28, 85)),
        }
        entities.append(_Entity(_PRODUCTS, values))
    for i in range(per_domain[2]):
        values = {
            "name": names.coin(_COMPOUND_HEADS, _COMPOUND_MIDS, _COMPOUND_TAILS, capitalize=False),
            "melt": str(rng.randrange(-90, 900)),
            "year": str(rng.randrange(1790, 2010)),
            "chemist": chemists[i % len(chemists)],
            "place": rng.choice(places),
            "use": rng.choice(("dye", "solvent", "catalyst", "preservative", "coating", "fuel")),
            "sector": rng.choice(("textile", "paint", "food", "plastics", "paper", "glass")),
            "solvent": rng.choice(("ethanol", "acetone", "ether", "benzene", "chloroform")),
            "dose": str(rng.randrange(2, 900)),
            "colour": rng.choice(("white", "yellow", "pale green", "deep red", "blue", "orange")),
            "shape": rng.choice(("needle", "cubic", "plate", "prism")),
        }
        entities.append(_Entity(_COMPOUNDS, values))
    return entities


def _groups(members: int) -> int:
    return max(1, members // 3)


def _write_passages(rng: Random, entities: list[_Entity]) -> list[tuple[str, str]]:
    passages: list[tuple[str, str]] = []
    for entity in entities:
        domain, values = entity.domain, entity.values
        title = values["name"]
        for attribute_name, attribute in domain.attributes.items():
            entity.fact_doc[attribute_name] = len(passages)
            answer = _sentence(rng.choice(attribute.passages).format(**values))
            passages.append(
                (title, " ".join([answer, *rng.sample(domain.fillers, rng.randint(0, 2))]))
            )
        entity.overview_doc = len(passages)
        passages.append((title, _sentence(rng.choice(domain.overview).format(**values))))
        for decoy in rng.sample(domain.decoys, 2):
            passages.append((title, _sentence(decoy.format(**values))))
    for domain in _DOMAINS:
        seen: set[str] = set()
        n_generic = 2 * sum(1 for entity in entities if entity.domain is domain)
        for _ in range(4 * n_generic):
            if len(seen) == n_generic:
                break
            text = " ".join(rng.sample(domain.generic, rng.randint(2, 4)))
            if text not in seen:
                seen.add(text)
                passages.append((rng.choice(domain.generic_titles), text))
    return passages


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


def _ask_questions(rng: Random, entities: list[_Entity], n_queries: int) -> list[_Query]:
    queries: list[_Query] = []
    for domain in _DOMAINS:
        groups: dict[str, list[_Entity]] = {}
        for entity in entities:
            if entity.domain is domain:
                groups.setdefault(entity.values[domain.list_key], []).append(entity)
        for members in groups.values():
            if len(members) < 2:
                continue
            relevant: dict[int, int] = {}
            for entity in members:
                relevant[entity.fact_doc[domain.list_attribute]] = 2
                if domain.list_attribute in domain.overview_restates:
                    relevant[entity.overview_doc] = 1
            text = domain.list_question.format(**members[0].values)
            queries.append(_Query(text, "list", domain.name, relevant))
    rng.shuffle(queries)
    del queries[round(_LIST_SHARE * n_queries) :]

    pairs = [(entity, attribute) for entity in entities for attribute in entity.domain.attributes]
    rng.shuffle(pairs)
    kinds, weights = zip(*_KIND_WEIGHTS.items(), strict=True)
    for entity, attribute_name in pairs:
        if len(queries) == n_queries:
            break
        domain = entity.domain
        attribute = domain.attributes[attribute_name]
        kind = rng.choices(kinds, weights)[0]
        if kind == "descriptive" and attribute_name in domain.descriptor_attributes:
            kind = "direct"
        if kind == "descriptive":
            ref = domain.descriptor.format(**entity.values)
            template = rng.choice(attribute.direct)
        else:
            ref = entity.values["name"]
            template = rng.choice(
                attribute.paraphrase if kind == "paraphrase" else attribute.direct
            )
        relevant = {entity.fact_doc[attribute_name]: 2}
        if attribute_name in domain.overview_restates:
            relevant[entity.overview_doc] = 1
        text = template.format(**{**entity.values, "ref": ref})
        queries.append(_Query(_sentence(text), kind, domain.name, relevant))
    rng.shuffle(queries)
    return queries
