"""Reading the small YAML settings files of a project (`.dstack/backend.yml`,
`.dstack/quotas.yml`): their documents, with YAML errors located like a config's."""

from __future__ import annotations

from typing import Any

import yaml

from dstack_plan.config import yaml_errors, yaml_fast
from dstack_plan.config.yaml_limits import shorten
from dstack_plan.errors import ConfigError, ConfigIssue


def read_documents(text: str, display: str) -> tuple[list[tuple[Any, Any]], list[ConfigIssue]]:
    """The non-empty documents of `text` as (node, data), and the duplicate keys found.

    ConfigError, at `display`'s line and column, when `text` is not YAML."""
    reader = yaml_fast.Documents(text)
    try:
        documents = [(node, data) for node, data in reader if data is not None]
    except yaml.YAMLError as e:
        raise ConfigError([yaml_errors.yaml_issue(e, display, text)]) from None
    except UnicodeEncodeError as e:
        raise ConfigError([yaml_errors.encoding_issue(e, display, text)]) from None
    except (ValueError, RecursionError) as e:
        raise ConfigError.at(display, 1, 1, f"cannot parse YAML: {shorten(str(e))}") from None
    return documents, [yaml_errors.yaml_issue(d, display, text) for d in reader.duplicates]
