"""Splits rendered manifests for a podman host, which has no cluster.

    kube_local.py RENDERED.yaml OUT_DIR

podman 4.3's `kube play` plays Deployments with the ConfigMaps they use, but no Job; it
stops at kinds it does not know; and it reads a Secret that `envFrom` names from podman's
own secret store, as one JSON object of base64 values (a Secret in the played YAML is
stored as its YAML text, which it then fails to read). So this writes:

- OUT_DIR/play.yaml: the ConfigMaps and Deployments, for `podman kube play`;
- OUT_DIR/secret-NAME.json: each Secret's values as that JSON object, for
  `podman secret create NAME`;
- OUT_DIR/job.args: `podman run` arguments, one a line, that run the Job's pod spec as
  the Job would: its image and arguments, its environment (from its ConfigMap and Secret
  references and its own `env`), its user and security context, the host's network.

Anything in the Job's pod spec that this cannot express fails the run instead of being
dropped silently.
"""

import base64
import json
import sys

import yaml

PLAYED = {"ConfigMap", "Deployment"}


def environment(container, configmaps, secrets):
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]])
        elif "secretRef" in source:
            env.update(secrets[source["secretRef"]["name"]])
        else:
            raise SystemExit(f"envFrom source not understood: {source}")
    for var in container.get("env", []):
        if "value" not in var:
            raise SystemExit(f"env entry not understood: {var}")
        env[var["name"]] = var["value"]
    return env


def job_args(job, configmaps, secrets):
    pod = job["spec"]["template"]["spec"]
    if len(pod["containers"]) != 1 or pod.get("initContainers") or pod.get("volumes"):
        raise SystemExit("the Job's pod must be one container without volumes")
    container = pod["containers"][0]
    pod_security = pod.get("securityContext", {})
    security = container.get("securityContext", {})
    args = ["--network", "host"]
    user = security.get("runAsUser", pod_security.get("runAsUser"))
    group = security.get("runAsGroup", pod_security.get("runAsGroup"))
    if user is not None:
        args += ["--user", f"{user}:{group}" if group is not None else str(user)]
    if security.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    for cap in security.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    if limit:
        args += ["--memory", limit.replace("Mi", "m").replace("Gi", "g")]
    for name, value in sorted(environment(container, configmaps, secrets).items()):
        args += ["-e", f"{name}={value}"]
    args.append(container["image"])
    args += container.get("command", []) + container.get("args", [])
    return args


def main():
    rendered, out = sys.argv[1], sys.argv[2]
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    secrets = {}
    for d in docs:
        if d["kind"] == "Secret":
            if d.get("data"):
                raise SystemExit("a Secret with base64 `data`: give `stringData` here")
            secrets[d["metadata"]["name"]] = d.get("stringData", {})
    jobs = [d for d in docs if d["kind"] == "Job"]
    if len(jobs) != 1:
        raise SystemExit(f"expected one Job, found {len(jobs)}")
    with open(f"{out}/play.yaml", "w") as f:
        yaml.safe_dump_all([d for d in docs if d["kind"] in PLAYED], f, sort_keys=False)
    for name, values in secrets.items():
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        with open(f"{out}/secret-{name}.json", "w") as f:
            json.dump(encoded, f)
    with open(f"{out}/job.args", "w") as f:
        f.write("\n".join(job_args(jobs[0], configmaps, secrets)) + "\n")


if __name__ == "__main__":
    main()
