"""A human-readable summary of a LeRobot dataset, for ``longboat data info``. Opening the dataset has checked its
metadata and every data file's parquet footer (cheap: a truncated file fails here rather than in a training run)."""

from __future__ import annotations

import av

from longboat.data.robot.meta import DatasetMeta


def describe(meta: DatasetMeta) -> str:
    info = meta.info
    lines = [
        f"dataset   {meta.root}",
        f"format    LeRobot {meta.version}",
        f"robot     {info.get('robot_type') or '-'}",
        f"fps       {meta.fps}",
        f"episodes  {len(meta.episodes.index)}",
        f"frames    {meta.total_frames}",
        f"tasks     {len(meta.tasks)}",
        "features",
    ]
    width = max(len(k) for k in meta.features)
    for key, ft in meta.features.items():
        extra = f"  {_codec(meta, key)}" if ft.is_video else ""
        lines.append(f"  {key:<{width}}  {ft.dtype:<8} {list(ft.shape)}{extra}")
    lines.append("task list")
    lines += [f"  {i:>3}  {t}" for i, t in enumerate(meta.tasks)]
    return "\n".join(lines)


def _codec(meta: DatasetMeta, key: str) -> str:
    """Codec and pixel format as info.json records them, else as the first video file says."""
    info = meta.features[key].info
    codec, pix_fmt = info.get("video.codec"), info.get("video.pix_fmt")
    if not codec and meta.episodes.video_file[key]:
        path = meta.root / meta.episodes.video_file[key][0]
        try:
            with av.open(str(path)) as c:
                s = c.streams.video[0]
                codec, pix_fmt = s.codec.canonical_name, s.pix_fmt
        except (OSError, IndexError, av.error.FFmpegError):  # missing or damaged: reading frames names it
            pass
    return f"{codec or 'unknown codec'} {pix_fmt or ''}".rstrip()
