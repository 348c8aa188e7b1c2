"""The files in deploy/ hold what they claim, checked with the tools that will read them.

- The alert rules pass `promtool check rules`, and their unit tests (`promtool test rules`) pass,
  with a firing case and a quiet case for every alert.
- Every PromQL expression of the Grafana dashboard parses: each becomes a recording rule in a
  temporary rules file, checked by `promtool check rules` (promtool 2.42 has no AST dump).
- Every metric the rules and the dashboard name is in a running broker's /metrics, with a
  configuration that makes every family appear (a template, a proxy, a token file, a Redis store).
- The Kubernetes manifest and the compose file parse as YAML, hold what a pod (or a fleet) needs,
  agree with themselves (volumes, mounts, ports, paths), and the broker configurations they carry
  pass the real binary's --check-config, with their secret files made (mode 0600) in a temporary
  directory, and the manifest's token file's emptyDir made as the kubelet makes it (mode 2777,
  the fsGroup's), shared read-only with the application.

promtool comes from Debian's `prometheus` package (`make test` installs it); without it these
tests fail, never skip. Only 127.0.0.1 is contacted.
"""
import base64
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from broker import Broker, run_broker
from test_fleet import RedisServer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
RULES = os.path.join(DEPLOY, "prometheus-rules.yaml")
RULE_TESTS = os.path.join(DEPLOY, "prometheus-rules.test.yaml")
PROMETHEUS_CONFIG = os.path.join(DEPLOY, "prometheus.yml")
DASHBOARD = os.path.join(DEPLOY, "grafana-dashboard.json")
KUBERNETES = os.path.join(DEPLOY, "kubernetes-sidecar.yaml")
COMPOSE = os.path.join(DEPLOY, "compose-fleet.yaml")
FLEET_CONFIG = os.path.join(DEPLOY, "fleet-config.json")

# The scrape job the rules assume (README; deploy/prometheus.yml).
JOB = "token-broker"
# The alerts the rules must have, at least.
REQUIRED_ALERTS = {
    "TokenBrokerDown",                      # up == 0 for the job
    "TokenBrokerNoValidToken",              # a provider with no valid token
    "TokenBrokerServingStaleTokens",        # stale answers
    "TokenBrokerRefreshFailing",            # refresh failing for minutes
    "TokenBrokerTokenExpiringUnrefreshed",  # a token inside its refresh margin
    "TokenBrokerExcessiveForcedRefreshes",  # forced refreshes refused
    "TokenBrokerStoreUnreachable",          # the token store degraded
}
# Grafana's own variables, replaced by plain values before promtool reads an expression.
GRAFANA_BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h", "__range_s": "3600",
                    "__interval_ms": "60000"}
# Values for the dashboard's template variables (any plain value parses; these look like real ones).
VARIABLE_VALUES = {"datasource": "prometheus", "job": JOB, "instance": "broker-1:9090", "provider": "orders"}
# A string literal in PromQL (double or single quotes, or backticks), removed before looking for names.
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
# A metric name of the broker's: an identifier starting token_broker_, whole (not a prefix of a longer
# one, not a function call), outside string literals.
BROKER_METRIC = re.compile(r"(?<![\w:])(token_broker_[A-Za-z0-9_:]*)(?![\w:(])")
# Label lists (`by (…)`, `on (…)`…), removed before looking for names: they hold labels, not metrics.
LABEL_LIST = re.compile(r"(?<![\w:])(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
# Prometheus's own `up`, the one other metric allowed.
UP = re.compile(r"(?<![\w:])up\s*(?:\{|\[|\)|\s|$)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|\[::1\]):\d+$")


# --- helpers ---

def promtool(*args, timeout=60):
    """Runs promtool; fails (never skips) when it is missing."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: install Debian's `prometheus` package "
                    "(apt-get install --no-install-recommends prometheus; `make test` installs it)")
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout)


def load_yaml(path):
    with open(path) as handle:
        return yaml.safe_load(handle)


def load_rules():
    document = load_yaml(RULES)
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    assert rules, "no rules in " + RULES
    return rules


def load_dashboard():
    with open(DASHBOARD) as handle:
        return json.load(handle)


def dashboard_panels(dashboard):
    """Every panel, those inside rows (collapsed rows keep theirs in `panels`) included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def substitute(expr, variables):
    """A dashboard expression with Grafana's variables replaced by plain values; fails on any left."""
    names = {**GRAFANA_BUILTINS, **variables}
    for name in sorted(names, key=len, reverse=True):
        value = names[name]
        expr = expr.replace("${%s}" % name, value).replace("[[%s]]" % name, value)
        expr = re.sub(r"\$%s(?![A-Za-z0-9_])" % re.escape(name), lambda _: value, expr)
    assert "$" not in expr, f"an undeclared Grafana variable in {expr!r}"
    return expr


def dashboard_expressions():
    """[(where, PromQL)] for every target of every panel, and every query variable's selector."""
    dashboard = load_dashboard()
    declared = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert declared <= set(VARIABLE_VALUES), f"no test value for the variables {declared - set(VARIABLE_VALUES)}"
    variables = {name: VARIABLE_VALUES[name] for name in declared}
    found = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            assert target.get("expr", "").strip(), f"panel {panel['title']!r} has a target without expr"
            found.append((f"panel {panel['id']} {panel['title']!r} target {target['refId']}",
                          substitute(target["expr"], variables)))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        matched = re.fullmatch(r"\s*label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", query)
        assert matched, f"variable {variable['name']}: {query!r} is not label_values(selector, label)"
        found.append((f"variable {variable['name']}", f"count({substitute(matched.group(1), variables)})"))
    assert found
    return found


def metric_names(expr):
    """The broker's metric names an expression uses, and whether it uses `up`."""
    code = LABEL_LIST.sub(" ", STRING.sub('""', expr))
    return set(BROKER_METRIC.findall(code)), bool(UP.search(code))


def exposed_series_names(text):
    """The series names a /metrics text holds: each family (a histogram as _bucket, _sum and _count) and each sample."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            if kind == "histogram":
                names.update(name + suffix for suffix in HISTOGRAM_SUFFIXES)
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def k8s_documents():
    with open(KUBERNETES) as handle:
        documents = [document for document in yaml.safe_load_all(handle) if document is not None]
    for document in documents:
        assert document.get("apiVersion") and document.get("kind"), document
        assert document.get("metadata", {}).get("name"), f"a {document['kind']} without metadata.name"
    return documents


def check_config(config_text, replacements, secret_files, tmp_path, env, warnings=0):
    """Writes a configuration (its paths moved into tmp_path) and its secret files (mode 0600), runs
    --check-config with `env` plus TOKEN_BROKER_CONFIG, and returns the result. Its only warnings
    must be those of the token files whose directory's writers are trusted, `warnings` of them."""
    for old, new in replacements.items():
        config_text = config_text.replace(old, new)
    for path, content in secret_files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(content)
        os.chmod(path, 0o600)
    config_path = os.path.join(str(tmp_path), "checked-config.json")
    with open(config_path, "w") as handle:
        handle.write(config_text)
    result = run_broker("--check-config", env={**env, "TOKEN_BROKER_CONFIG": config_path})
    warned = [line for line in result.stderr.splitlines() if "level=warn" in line]
    assert len(warned) == warnings and all("trustDirectoryWriters" in line for line in warned), result.stderr
    return result


def config_paths(value, key=""):
    """Every (key, value) of a configuration whose key names a file (…File, path)."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield from config_paths(item, name)
    elif isinstance(value, list):
        for item in value:
            yield from config_paths(item, key)
    elif isinstance(value, str) and (key.endswith("File") or key == "path"):
        yield key, value


# --- the alert rules ---

def test_the_alert_rules_pass_promtool_check_rules():
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_every_alert_has_a_severity_a_summary_a_description_and_a_for_duration():
    rules = load_rules()
    alerts = {rule["alert"]: rule for rule in rules if "alert" in rule}
    assert REQUIRED_ALERTS <= set(alerts), f"missing alerts: {REQUIRED_ALERTS - set(alerts)}"
    for name, rule in alerts.items():
        assert rule.get("labels", {}).get("severity") in {"critical", "warning", "info"}, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary", "").strip() and annotations.get("description", "").strip(), name
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{name}: no for: duration"
    # Counters are judged by their rate or increase, never by their raw value.
    for rule in rules:
        code = STRING.sub('""', rule["expr"])
        for name in BROKER_METRIC.findall(code):
            if name.endswith("_total"):
                assert re.search(r"(rate|increase)\(\s*%s\b" % name, code), f"{rule['alert']}: {name} used raw"
    # The broker-down alert is on the documented job.
    assert re.search(r'up\{job="%s"\}\s*==\s*0' % JOB, alerts["TokenBrokerDown"]["expr"])


def test_the_alert_rules_unit_tests_pass_with_a_firing_and_a_quiet_case_per_alert():
    result = promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout
    tests = load_yaml(RULE_TESTS)
    assert tests["rule_files"] == [os.path.basename(RULES)]
    firing, quiet = set(), set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in load_rules() if "alert" in rule}
    assert alerts - firing == set(), f"alerts never shown firing: {alerts - firing}"
    assert alerts - quiet == set(), f"alerts never shown quiet: {alerts - quiet}"


def test_the_prometheus_configuration_is_valid_and_scrapes_the_job_the_rules_assume():
    result = promtool("check", "config", PROMETHEUS_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    config = load_yaml(PROMETHEUS_CONFIG)
    assert os.path.basename(RULES) in config["rule_files"]
    assert JOB in [job["job_name"] for job in config["scrape_configs"]]


# --- the dashboard ---

def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_datasource_variable():
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41 and dashboard["title"] and dashboard["uid"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, variable["name"]
    panels = dashboard_panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel.get("targets") and panel.get("description"), panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], panel["title"]
    # The panels the dashboard is for, by the metric each shows.
    shown = set()
    for _, expr in dashboard_expressions():
        shown |= metric_names(expr)[0]
    for name in ("token_broker_token_expiry_seconds", "token_broker_refreshes_total",
                 "token_broker_http_requests_total", "token_broker_longpoll_waiters",
                 "token_broker_upstream_responses_total", "token_broker_proxy_requests_total",
                 "token_broker_store_reachable", "token_broker_template_children"):
        assert name in shown, f"no panel shows {name}"


def test_every_dashboard_expression_parses(tmp_path):
    expressions = dashboard_expressions()
    rules = [{"record": f"dashboard:expression_{index}", "expr": expr} for index, (_, expr) in enumerate(expressions)]
    path = tmp_path / "dashboard-expressions.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False))
    result = promtool("check", "rules", str(path))
    where = "\n".join(f"dashboard:expression_{index}: {place}" for index, (place, _) in enumerate(expressions))
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{where}"
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout


# --- every metric named exists ---

@pytest.fixture
def full_broker(tmp_path):
    """A broker whose /metrics holds every family: a template, a proxy, a token file and a Redis store."""
    redis = RedisServer()
    try:
        key_file = tmp_path / "store.key"
        key_file.write_text(os.urandom(32).hex() + "\n")
        key_file.chmod(0o600)
        sinks = tmp_path / "sinks"
        sinks.mkdir(mode=0o700)
        config = {
            "providers": [
                {"name": "default", "source": {"type": "jwt", "lifetimeSec": 300}},
                {"name": "apis", "perRequest": ["audience"], "allowedAudiences": ["https://orders.example"],
                 "maxChildren": 1, "source": {"type": "jwt"}},
            ],
            "proxies": [{"name": "orders", "target": "http://127.0.0.1:9/api", "provider": "default"}],
            "sinks": [{"provider": "default", "path": str(sinks / "default.token")}],
            "store": {"type": "redis", "address": "unix:" + redis.socket, "keyFile": str(key_file)},
        }
        with Broker(config) as running:
            yield running
    finally:
        redis.kill()
        shutil.rmtree(redis.directory, ignore_errors=True)


def test_every_metric_the_rules_and_the_dashboard_name_is_exposed_by_a_running_broker(full_broker):
    # Some traffic, so that counters have samples as well as families.
    full_broker.request("GET", "/token")
    full_broker.request("GET", "/providers/apis/token?audience=https://orders.example")
    full_broker.request("GET", "/proxy/orders/items")
    status, _, body = full_broker.request("GET", "/metrics", listener="admin")
    assert status == 200
    exposed = exposed_series_names(body.decode())
    assert "token_broker_store_reachable" in exposed and "token_broker_template_children" in exposed, sorted(exposed)

    used = {}
    expressions = [(f"rule {rule.get('alert') or rule.get('record')}", rule["expr"]) for rule in load_rules()]
    expressions += dashboard_expressions()
    for where, expr in expressions:
        names, uses_up = metric_names(expr)
        assert names or uses_up, f"{where}: no known metric in {expr!r}"
        for name in names:
            used.setdefault(name, []).append(where)
    missing = {name: places for name, places in used.items() if name not in exposed}
    assert not missing, f"metrics named but not in /metrics: {missing}"


def test_the_readmes_metrics_table_lists_exactly_the_families_a_running_broker_exports(full_broker):
    full_broker.request("GET", "/proxy/orders/items")
    status, _, body = full_broker.request("GET", "/metrics", listener="admin")
    assert status == 200
    families = {line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE token_broker_")}
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = readme[readme.index("`/metrics` (Prometheus text format"):readme.index("## When the broker calls your issuer")]
    documented = set(re.findall(r"`(token_broker_[a-z_]+)`", table))
    assert families - documented == set(), "exported but not in the README's table"
    assert documented - families == set(), "in the README's table but not exported"


def test_the_metric_name_extraction_finds_names_and_ignores_strings():
    names, uses_up = metric_names(
        'sum by (provider) (rate(token_broker_refreshes_total{result!="token_broker_fake"}[5m])) '
        '/ token_broker_x_count>0 unless up{job="a"} == 0 and on(token_broker_label) token_broker_gauge')
    assert names == {"token_broker_refreshes_total", "token_broker_x_count", "token_broker_gauge"}
    assert uses_up
    assert metric_names('count(up)') == (set(), True)
    assert metric_names('vector(1) > bool 0') == (set(), False)
    assert metric_names('setup{a="b"}') == (set(), False)


# --- the Kubernetes manifest ---

def pod_spec(documents):
    for document in documents:
        if document["kind"] == "Pod":
            return document["spec"]
        if document["kind"] in {"Deployment", "StatefulSet", "DaemonSet"}:
            return document["spec"]["template"]["spec"]
    raise AssertionError("no Pod or workload in " + KUBERNETES)


def broker_container(spec):
    """The broker's container: in containers, or a native sidecar (an init container with restartPolicy: Always)."""
    candidates = [c for c in spec.get("containers", []) if c["image"].split("/")[-1].startswith("token-broker")]
    candidates += [c for c in spec.get("initContainers", []) if c["image"].split("/")[-1].startswith("token-broker")
                   and c.get("restartPolicy") == "Always"]
    assert len(candidates) == 1, candidates
    return candidates[0]


def test_the_kubernetes_manifest_runs_the_broker_as_a_hardened_sidecar_probed_on_its_admin_listener():
    documents = k8s_documents()
    by_kind = {}
    for document in documents:
        by_kind.setdefault(document["kind"], {})[document["metadata"]["name"]] = document
    spec = pod_spec(documents)
    containers = spec["containers"] + spec.get("initContainers", [])
    for container in containers:
        assert container.get("name") and container.get("image"), container
    broker = broker_container(spec)
    apps = [c for c in spec["containers"] if c is not broker]
    assert apps, "no application container beside the broker"

    pod_security = spec.get("securityContext", {})
    for container in containers:
        security = {**pod_security, **container.get("securityContext", {})}
        assert security.get("readOnlyRootFilesystem") is True, container["name"]
        assert security.get("runAsNonRoot") is True, container["name"]
        assert security.get("allowPrivilegeEscalation") is False, container["name"]
        assert "ALL" in security.get("capabilities", {}).get("drop", []), container["name"]
    assert {**pod_security, **broker.get("securityContext", {})}.get("runAsUser") == 10001  # the Dockerfile's user

    # Volumes: every mount names a declared volume, whose ConfigMap or Secret is in the file with the keys it maps.
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    for container in containers:
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{container['name']} mounts undeclared volume {mount['name']}"
    for volume in volumes.values():
        for kind, field, name_key in (("ConfigMap", "configMap", "name"), ("Secret", "secret", "secretName")):
            if field in volume:
                source = by_kind.get(kind, {}).get(volume[field][name_key])
                assert source, f"volume {volume['name']}: no {kind} {volume[field][name_key]}"
                keys = set(source.get("data", {})) | set(source.get("stringData", {}))
                for item in volume[field].get("items", []):
                    assert item["key"] in keys, f"volume {volume['name']}: no key {item['key']}"
    # No real secret: every value is an obvious placeholder.
    for secret in by_kind.get("Secret", {}).values():
        assert "data" not in secret, "a Secret with base64 data: use stringData placeholders"
        for key, value in secret.get("stringData", {}).items():
            assert "REPLACE-ME" in value, f"Secret {secret['metadata']['name']} key {key} is not a placeholder"

    # Listeners: the token listener on loopback, probes on the admin listener's port.
    env = {item["name"]: item.get("value") for item in broker.get("env", [])}
    assert LOOPBACK.match(env["TOKEN_BROKER_LISTEN"]) or env["TOKEN_BROKER_LISTEN"].startswith("unix:"), env
    admin_port = int(env["TOKEN_BROKER_ADMIN_LISTEN"].rsplit(":", 1)[1])
    ports = {port.get("name"): port["containerPort"] for port in broker.get("ports", [])}
    assert admin_port in ports.values()
    probed = {}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in broker:
            get = broker[probe]["httpGet"]
            port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
            assert port == admin_port, f"{probe} is not on the admin listener"
            probed[probe] = get["path"]
    assert probed.get("livenessProbe") == "/healthz" and probed.get("readinessProbe") == "/readyz", probed

    # TOKEN_BROKER_CONFIG names a file of a mounted ConfigMap.
    mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in broker.get("volumeMounts", [])}
    directory, filename = os.path.split(env["TOKEN_BROKER_CONFIG"])
    assert "configMap" in mounts.get(directory, {}), f"{directory} is not a ConfigMap mount"
    config_map = by_kind["ConfigMap"][mounts[directory]["configMap"]["name"]]
    items = {item["path"]: item["key"] for item in mounts[directory]["configMap"].get("items", [])} or \
        {key: key for key in config_map["data"]}
    assert filename in items, f"{filename} is not a file of the ConfigMap"
    json.loads(config_map["data"][items[filename]])


def test_the_kubernetes_brokers_configuration_passes_check_config(tmp_path):
    documents = k8s_documents()
    by_kind = {}
    for document in documents:
        by_kind.setdefault(document["kind"], {})[document["metadata"]["name"]] = document
    spec = pod_spec(documents)
    broker = broker_container(spec)
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    env = {item["name"]: item["value"] for item in broker["env"]}
    replacements, files, config_text = {}, {}, None
    for mount in broker["volumeMounts"]:
        volume = volumes[mount["name"]]
        local = str(tmp_path / mount["name"])
        replacements[mount["mountPath"]] = local
        if "secret" in volume:
            secret = by_kind["Secret"][volume["secret"]["secretName"]]
            contents = {key: value.encode() for key, value in secret.get("stringData", {}).items()}
            contents.update({key: base64.b64decode(value) for key, value in secret.get("data", {}).items()})
            items = volume["secret"].get("items") or [{"key": key, "path": key} for key in contents]
            for item in items:
                files[os.path.join(local, item["path"])] = contents[item["key"]]
        if "configMap" in volume:
            config_map = by_kind["ConfigMap"][volume["configMap"]["name"]]
            items = volume["configMap"].get("items") or [{"key": key, "path": key} for key in config_map["data"]]
            for item in items:
                if os.path.join(mount["mountPath"], item["path"]) == env["TOKEN_BROKER_CONFIG"]:
                    config_text = config_map["data"][item["key"]]
    assert config_text, "TOKEN_BROKER_CONFIG is no file of a mounted ConfigMap"
    config = json.loads(config_text)
    sinks = config.get("sinks", [])
    # Every file the configuration names is one the pod mounts; the token files are checked below.
    for key, path in config_paths(config):
        if path in {sink["path"] for sink in sinks}:
            continue
        assert any(path.startswith(prefix + "/") for prefix in replacements), f"{key} {path} is not mounted"
        local = path
        for old, new in replacements.items():
            local = local.replace(old, new)
        assert local in files, f"{key} {path} is no file of the mounted Secret"
    # Each token file is in an emptyDir that the broker mounts writable and an application
    # container mounts read-only; made here as the kubelet makes it, mode 0777, or with the pod's
    # fsGroup, its group and the setgid bit (2777), which only a sink trusting its directory's
    # writers accepts. Its mode lets the fsGroup read it.
    fs_group = spec.get("securityContext", {}).get("fsGroup")
    apps = [container for container in spec["containers"] if container is not broker]
    for index, sink in enumerate(sinks):
        directory = os.path.dirname(sink["path"])
        [mount] = [mount for mount in broker["volumeMounts"] if mount["mountPath"] == directory]
        assert "emptyDir" in volumes[mount["name"]] and not mount.get("readOnly"), mount
        readers = [m for app in apps for m in app.get("volumeMounts", []) if m["name"] == mount["name"]]
        assert readers and all(m.get("readOnly") is True for m in readers), f"sinks[{index}]: {readers}"
        assert sink.get("trustDirectoryWriters") is True, f"sinks[{index}] cannot use an emptyDir without it"
        if fs_group is not None:
            assert int(sink.get("mode", "0600"), 8) & 0o040, f"sinks[{index}]: the fsGroup cannot read mode {sink['mode']}"
        local = replacements[directory]
        os.makedirs(local)
        if fs_group is not None:
            os.chown(local, -1, fs_group if os.geteuid() == 0 else os.getegid())
        os.chmod(local, 0o2777 if fs_group is not None else 0o777)
    result = check_config(config_text, replacements, files, tmp_path,
                          {name: value for name, value in env.items() if name != "TOKEN_BROKER_CONFIG"},
                          warnings=len(sinks))
    for sink in sinks:
        assert replacements[os.path.dirname(sink["path"])] in result.stderr, result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    listen, admin = env["TOKEN_BROKER_LISTEN"], env["TOKEN_BROKER_ADMIN_LISTEN"]
    assert f"token listener {listen}, admin listener {admin}" in result.stdout, result.stdout


# --- the compose fleet ---

def test_the_compose_fleet_is_consistent_and_its_configuration_passes_check_config(tmp_path):
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    for name, service in services.items():
        assert service.get("image"), f"service {name} has no image"
    declared_networks = set(compose.get("networks", {}))
    for name, service in services.items():
        assert set(service.get("networks", [])) <= declared_networks, f"{name} joins an undeclared network"
    broker = services["broker"]
    assert broker["image"] == "token-broker"  # the README's `docker build -t token-broker .`
    assert "command" not in broker or broker["command"][0].startswith("-"), \
        "the image's ENTRYPOINT is token-broker: a command repeating it is an unknown argument"
    assert broker.get("deploy", {}).get("replicas", 1) >= 2
    assert broker.get("read_only") is True and "ALL" in broker.get("cap_drop", [])

    # Bind mounts: files shipped in deploy/ exist; the config mount is the one TOKEN_BROKER_CONFIG names.
    mounts = {}
    for volume in broker["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = source
        if source != "./secrets":  # made by the operator (see the file's header), never committed
            assert os.path.exists(os.path.join(DEPLOY, source)), source
    config_target = broker["environment"]["TOKEN_BROKER_CONFIG"]
    assert os.path.normpath(os.path.join(DEPLOY, mounts[config_target])) == FLEET_CONFIG
    with open(FLEET_CONFIG) as handle:
        config_text = handle.read()
    config = json.loads(config_text)

    # The store is the compose file's Redis, on a network the brokers share with it.
    store = config["store"]
    assert store["type"] == "redis"
    host = store["address"].rsplit(":", 1)[0]
    assert host in services and set(services[host]["networks"]) & set(broker["networks"])
    assert services[host]["image"].startswith("redis:")

    # Prometheus scrapes the brokers' admin port as the rules' job and loads the rules.
    prometheus = services["prometheus"]
    targets = {volume.split(":")[1]: volume.split(":")[0] for volume in prometheus["volumes"]}
    assert os.path.normpath(os.path.join(DEPLOY, targets["/etc/prometheus/prometheus.yml"])) == PROMETHEUS_CONFIG
    rules_target = os.path.join("/etc/prometheus", load_yaml(PROMETHEUS_CONFIG)["rule_files"][0])
    assert os.path.normpath(os.path.join(DEPLOY, targets[rules_target])) == RULES
    assert set(prometheus["networks"]) & set(broker["networks"])
    job = next(job for job in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"] if job["job_name"] == JOB)
    admin_port = int(config["adminListen"].rsplit(":", 1)[1])
    assert job["dns_sd_configs"][0]["names"] == ["broker"] and job["dns_sd_configs"][0]["port"] == admin_port

    # The configuration passes --check-config with its secret files under the mounted directory.
    secrets_target = next(target for target, source in mounts.items() if source == "./secrets")
    local_secrets = str(tmp_path / "secrets")
    files = {}
    for key, path in config_paths(config):
        assert path.startswith(secrets_target + "/"), f"{key} {path} is not under {secrets_target}"
        local = path.replace(secrets_target, local_secrets, 1)
        files[local] = os.urandom(32).hex().encode() if key == "keyFile" else b"placeholder-client-secret"
    assert files, "the fleet configuration names no secret file"
    result = check_config(config_text, {secrets_target: local_secrets}, files, tmp_path, {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "configuration OK" in result.stdout, result.stdout
