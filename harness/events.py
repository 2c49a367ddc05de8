"""TensorBoard event files, written with TensorBoard's own protobufs and record writer.

This module owns :class:`EventWriter`: scalars, histograms, images and the HParams record
of one run, appended to an ``events.out.tfevents.*`` file in the run folder. It uses only
``tensorboard`` (already needed to serve and read the files), so a run never imports
TensorFlow or PyTorch; TensorBoard's ``EventAccumulator`` reads the files back.

Non-finite values are the caller's business: a scalar may be nan or inf (TensorBoard shows
it as such), a histogram keeps only the finite entries it is given.
"""

from __future__ import annotations

import io
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import struct_pb2
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

__all__ = ["EventWriter", "figure_rgb", "png_bytes"]


def figure_rgb(figure: Any) -> np.ndarray:
    """Draw a matplotlib figure (on its Agg canvas) and return it as an RGB uint8 array
    ``(height, width, 3)``, the form :meth:`EventWriter.image` and the video writer take."""
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()


def png_bytes(image: np.ndarray) -> bytes:
    """Encode an RGB uint8 image ``(height, width, 3)`` as PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), mode="RGB").save(buffer, format="PNG")
    return buffer.getvalue()


class EventWriter:
    """Appends TensorBoard events for one run.

    Args:
        logdir: Folder that receives the event file (created if missing).
        purge_step: When a run resumes at this iteration, every event an earlier process of
            the same run wrote at or after it is hidden by TensorBoard (a ``SessionLog``
            START record at that step), so the curves have no duplicated steps.
    """

    def __init__(self, logdir: str | Path, *, purge_step: int | None = None):
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        # Flushing is explicit (once per log interval), never on a timer thread's whim.
        self._file = EventFileWriter(str(self.logdir), max_queue_size=1_000_000, flush_secs=3600)
        if purge_step is not None:
            self._add(Event(step=int(purge_step), session_log=SessionLog(status=SessionLog.START)))

    def _add(self, event: Event) -> None:
        if not event.wall_time:
            event.wall_time = time.time()
        self._file.add_event(event)

    def _summary(self, step: int, *values: Summary.Value, wall_time: float | None = None) -> None:
        event = Event(step=int(step), summary=Summary(value=list(values)))
        if wall_time is not None:
            event.wall_time = wall_time
        self._add(event)

    def scalars(self, step: int, values: Mapping[str, float], *, wall_time: float | None = None) -> None:
        """One scalar per tag at ``step`` (nan and inf are stored as they are); ``wall_time``
        (seconds since the epoch) for a value copied from another event file, else now."""
        protos = (Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items())
        self._summary(step, *protos, wall_time=wall_time)

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        """A histogram of the finite entries of ``values`` (numpy's ``auto`` bins); nothing if none is finite."""
        flat = np.asarray(values, dtype=np.float64).ravel()
        flat = flat[np.isfinite(flat)]
        if not flat.size:
            return
        counts, edges = np.histogram(flat, bins="auto")
        proto = HistogramProto(
            min=float(flat.min()),
            max=float(flat.max()),
            num=float(flat.size),
            sum=float(flat.sum()),
            sum_squares=float(np.dot(flat, flat)),
            bucket_limit=[float(e) for e in edges[1:]],
            bucket=[float(c) for c in counts],
        )
        self._summary(step, Summary.Value(tag=tag, histo=proto))

    def image(self, step: int, tag: str, image: np.ndarray) -> None:
        """An RGB image, uint8 ``(height, width, 3)``, stored as PNG."""
        height, width = image.shape[:2]
        encoded = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=png_bytes(image))
        self._summary(step, Summary.Value(tag=tag, image=encoded))

    def hparams(
        self,
        values: Mapping[str, bool | int | float | str],
        metrics: Mapping[str, str],
        *,
        step: int,
        differs: Collection[str] = (),
    ):
        """The run's row of TensorBoard's HParams dashboard: its hyperparameters, and which
        scalar tags are its metrics (tag -> column title; the dashboard shows each tag's
        last value, so the tags must be written as scalars too).

        The experiment, session-start and session-end records go into this run's own event
        file at ``step``, so every run of a sweep is one row of the table. TensorBoard shows
        the experiment record of one of the runs, so every run of a sweep names the
        hyperparameters that differ between the runs (``differs``); the dashboard lists those
        first.
        """
        infos, start = [], plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
        for key, value in values.items():
            if isinstance(value, bool):
                kind = api_pb2.DATA_TYPE_BOOL
                start.hparams[key].CopyFrom(struct_pb2.Value(bool_value=value))
            elif isinstance(value, int | float):
                kind = api_pb2.DATA_TYPE_FLOAT64
                start.hparams[key].CopyFrom(struct_pb2.Value(number_value=float(value)))
            else:
                kind = api_pb2.DATA_TYPE_STRING
                start.hparams[key].CopyFrom(struct_pb2.Value(string_value=str(value)))
            infos.append(api_pb2.HParamInfo(name=key, type=kind, differs=key in differs))
        experiment = api_pb2.Experiment(
            hparam_infos=infos,
            metric_infos=[
                api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=title)
                for tag, title in metrics.items()
            ],
        )
        records = (
            (metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment)),
            (metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)),
            (
                metadata.SESSION_END_INFO_TAG,
                plugin_data_pb2.HParamsPluginData(
                    session_end_info=plugin_data_pb2.SessionEndInfo(
                        status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time()
                    )
                ),
            ),
        )
        for tag, data in records:
            value = Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data))
            value.tensor.CopyFrom(metadata.NULL_TENSOR)
            self._summary(step, value)
        self.flush()

    def flush(self) -> None:
        """Write every queued event to disk."""
        self._file.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._file.close()
