"""One source for each config default (assets/_config.py; docs/architecture.md, "Configuration").

Every run config the code location shows in the Launchpad (a ``dagster.Config`` subclass defined
in assets/, pipelines/ or resources/) must be declared with ``@mirrors``: each field has the same
default as the ops dataclass it mirrors, or is named ``own`` (asset-only, e.g. a launch timeout).
Resources (``dg.ConfigurableResource``, also ``Config`` subclasses) are not run configs and are
left out. The offenders are listed all at once, one per line, so the failure reads as a to-do list.
"""

import dataclasses
import importlib
import pkgutil

import dagster as dg
import pytest

import pipelines.definitions  # noqa: F401  (the code location: imports every asset module)
from assets._config import MIRRORS, attribute_docs, fields_of, mirrors, mismatches
from ops.lm.spec import build

PACKAGES = ("assets", "pipelines", "resources")


def project_config_classes() -> list[type]:
    """Every ``dg.Config`` subclass (recursively) whose module is in :data:`PACKAGES`, resources
    excluded. Every module of those packages is imported first, so a class in a module the
    definitions do not import is found too."""
    for pkg in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            importlib.import_module(info.name)
    found, stack = {}, [dg.Config]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.split(".")[0] in PACKAGES and not issubclass(sub, dg.ConfigurableResource):
                found[f"{sub.__module__}.{sub.__qualname__}"] = sub
    return [found[k] for k in sorted(found)]


@pytest.fixture
def restore_mirrors():
    """The registry as it was: a class that fails ``@mirrors`` is registered before it raises."""
    saved = dict(MIRRORS)
    yield
    MIRRORS.clear()
    MIRRORS.update(saved)


def test_the_walk_finds_the_run_configs_and_no_resource():
    names = {c.__name__ for c in project_config_classes()}
    # one per group, including a subclass (DedupConfig extends ExactDedupConfig)
    assert {"RawProblemsConfig", "DedupConfig", "ExactDedupConfig", "LawFitConfig", "CTRModelConfig",
            "SynthesisConfig"} <= names
    assert not names & {"LakeResource", "TeacherResource", "SourcesResource", "ComputeResource"}


def test_every_config_class_mirrors_an_ops_dataclass():
    offenders = []
    for cls in project_config_classes():
        where = f"{cls.__module__}.{cls.__qualname__}"
        if cls not in MIRRORS:
            offenders.append(f"{where}: not registered (decorate it with @mirrors(<ops dataclass>, own=...))")
            continue
        source, _ = MIRRORS[cls]
        if source is not None and not dataclasses.is_dataclass(source):
            offenders.append(f"{where}: mirrors {source!r}, which is not a dataclass")
            continue
        offenders += [f"{where}: {m}" for m in mismatches(cls)]
    if offenders:
        pytest.fail(f"{len(offenders)} config classes break the one-source rule:\n" + "\n".join(offenders), pytrace=False)


def test_every_launchpad_default_passes_the_ops_validation():
    """The defaults a user sees in the Launchpad build the ops dataclass without error (the asset
    boundary's check accepts what it offers). Classes whose dataclass needs fields the run config
    does not carry (e.g. paths the asset fills in) are skipped."""
    offenders = []
    for cls, (source, own) in sorted(MIRRORS.items(), key=lambda kv: kv[0].__qualname__):
        if source is None or cls.__module__.split(".")[0] not in PACKAGES:
            continue
        if any(f.is_required() for f in cls.model_fields.values()):
            continue
        values = cls().model_dump(exclude=set(own))
        required = [f.name for f in dataclasses.fields(source) if f.init and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]  # type: ignore[misc]
        if any(r not in values for r in required):
            continue
        try:
            build(source, values)         # nested config -> the typed parts (what the asset's to_spec does)
        except Exception as e:  # noqa: BLE001 - every failure is reported, with its class
            offenders.append(f"{cls.__module__}.{cls.__qualname__} -> {source.__name__}: {type(e).__name__}: {e}")
    if offenders:
        pytest.fail("Launchpad defaults the ops validation rejects:\n" + "\n".join(offenders), pytrace=False)


@dataclasses.dataclass
class _Source:
    ngram: int = 8
    threshold: float = 0.8
    priority: list[str] = dataclasses.field(default_factory=lambda: ["a", "b"])


@pytest.mark.parametrize("field, default, message", [
    ("threshold", 0.75, r"_Bad\.threshold: default 0\.75 != _Source\.threshold 0\.8"),          # a drifted default
    ("timeout_s", 60.0, r"_Bad\.timeout_s: not a field of _Source and not declared own"),  # neither mirrored nor own
])
def test_a_field_that_breaks_the_rule_raises_naming_it(restore_mirrors, field, default, message):
    with pytest.raises(TypeError, match=message):
        mirrors(_Source)(type("_Bad", (dg.Config,), {"__annotations__": {"ngram": int, field: float},
                                                     "ngram": 8, field: default}))


def test_own_fields_and_sequence_defaults_pass(restore_mirrors):
    @mirrors(_Source, own=("timeout_s",))
    class _Good(dg.Config):
        ngram: int = 8
        priority: list[str] = ["a", "b"]  # a list default equals the dataclass's default_factory
        timeout_s: float = 60.0

    assert MIRRORS[_Good] == (_Source, frozenset({"timeout_s"})) and mismatches(_Good) == []


@dataclasses.dataclass
class _Documented:
    ngram: int = 8
    """Word n-gram length."""
    widths: tuple[int, ...] = (64, 32)
    """Hidden widths (a tuple in the ops dataclass)."""
    path: str = ""


def test_fields_of_generates_types_defaults_and_descriptions(restore_mirrors):
    @mirrors(_Documented, own=("timeout_s",))
    class _Gen(fields_of(_Documented, exclude=("path",))):
        timeout_s: float = 60.0

    f = _Gen.model_fields
    assert list(f) == ["ngram", "widths", "timeout_s"]  # the dataclass's order, then the own field
    assert (f["ngram"].annotation, f["ngram"].default, f["ngram"].description) == (int, 8, "Word n-gram length.")
    assert f["widths"].annotation == list[int] and f["widths"].default == [64, 32]  # Dagster config has no tuples
    assert mismatches(_Gen) == [] and _Gen(widths=[1]).widths == [1]


def test_fields_of_rejects_an_exclude_that_names_no_field():
    with pytest.raises(TypeError, match=r"fields_of\(_Documented\): exclude names fields it does not have: \['pth'\]"):
        fields_of(_Documented, exclude=("pth",))


def test_the_launchpad_shows_the_ops_docstrings():
    """The run-config schema Dagster builds for an asset (what the Launchpad renders) carries the
    attribute docstring written under the field in the ops dataclass, and its default."""
    from assets.curation import decontaminated_problems
    from ops.curation.decontam import DecontamConfig

    schema = decontaminated_problems.op.config_schema.config_type.fields
    doc = attribute_docs(DecontamConfig)["semantic_threshold"]
    assert doc.startswith("Embedding cosine")
    assert schema["semantic_threshold"].description == doc
    assert schema["semantic_threshold"].default_value == DecontamConfig().semantic_threshold
    assert "num_perm" not in schema  # the one field DecontaminationConfig excludes


def test_every_launchpad_and_resource_field_has_a_description():
    """Every field a user can set in the Launchpad (run configs) or on a resource (the UI's resource
    page, deployment YAML) carries a description: the attribute docstring under it, in the ops
    dataclass for a generated field or in the class body for an asset's own field."""
    resource_classes, stack = [], [dg.ConfigurableResource]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.split(".")[0] == "resources":
                resource_classes.append(sub)
    assert {"LakeResource", "TeacherResource", "ComputeResource", "RetryingComputeResource"} <= {c.__name__ for c in resource_classes}
    classes = project_config_classes() + resource_classes
    missing = [f"{c.__module__}.{c.__qualname__}.{n}" for c in classes for n, f in c.model_fields.items()
               if not (f.description or "").strip()]
    assert not missing, f"{len(missing)} fields without a description:\n" + "\n".join(sorted(set(missing)))


def test_attribute_docs_reads_only_the_docstring_under_each_field():
    from ops.docstrings import own_attribute_docs

    assert own_attribute_docs(_Documented) == {"ngram": "Word n-gram length.",
                                              "widths": "Hidden widths (a tuple in the ops dataclass)."}
    assert own_attribute_docs(type("_Runtime", (), {})) == {}  # no source: nothing, no error
