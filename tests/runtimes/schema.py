"""Validation against the published Kubeflow Trainer API models (PyPI ``kubeflow-trainer-api``).

The generated pydantic models silently drop keys they do not know, so a round trip
(``from_dict`` then ``to_dict``) that comes back different from the input names exactly the field
that is misspelt, misplaced or of the wrong type; :func:`round_trip_differences` lists them.
"""

from __future__ import annotations

from typing import Any

from kubeflow_trainer_api import models

# kind → the model class that validates it (apiVersion is checked separately).
MODELS: dict[str, type] = {
    "ClusterTrainingRuntime": models.TrainerV1alpha1ClusterTrainingRuntime,
    "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime,
    "TrainJob": models.TrainerV1alpha1TrainJob,
    "Secret": models.IoK8sApiCoreV1Secret,
    "ServiceAccount": models.IoK8sApiCoreV1ServiceAccount,
    "PersistentVolumeClaim": models.IoK8sApiCoreV1PersistentVolumeClaim,
    "CronJob": models.IoK8sApiBatchV1CronJob,
}
API_VERSIONS = {
    "ClusterTrainingRuntime": "trainer.kubeflow.org/v1alpha1",
    "TrainingRuntime": "trainer.kubeflow.org/v1alpha1",
    "TrainJob": "trainer.kubeflow.org/v1alpha1",
    "Secret": "v1",
    "ServiceAccount": "v1",
    "PersistentVolumeClaim": "v1",
    "CronJob": "batch/v1",
}


def round_trip(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` parsed by its kind's API model and dumped back (pydantic errors propagate)."""
    model = MODELS[doc["kind"]]
    return model.from_dict(doc).to_dict()


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    """Human-readable list of where ``after`` differs from ``before`` (empty when equal)."""
    here = path or "<root>"
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in before.keys() | after.keys():
            sub = f"{path}.{key}" if path else str(key)
            if key not in after:
                found.append(f"{sub}: dropped by the API model (misspelt or unknown field)")
            elif key not in before:
                found.append(f"{sub}: added by the API model")
            else:
                found.extend(differences(before[key], after[key], sub))
        return found
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{here}: {len(before)} items became {len(after)}"]
        found = []
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            found.extend(differences(old, new, f"{path}[{index}]"))
        return found
    if type(before) is not type(after) or before != after:
        return [f"{here}: {before!r} became {after!r} (wrong type for this field?)"]
    return []


def round_trip_differences(doc: dict[str, Any]) -> list[str]:
    return differences(doc, round_trip(doc))
