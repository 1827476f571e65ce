"""NonMaxSuppression as onnxruntime computes it: greedy, per batch and class, in float32.

Detectors exported end to end (ultralytics' `export(nms=True)`, torchvision's) run one NMS over every
anchor that passes the score floor: thousands of boxes, hundreds kept. The kept list is checked box
by box against each candidate; as Python calls per pair that was 1.6 s for YOLO11n at 320x320
(2,100 candidates) and 12.8 s at 2 x 416 x 480, where onnxruntime takes milliseconds. Here one
compiled loop (numba, runtime/jit.py) or, with compiled kernels off, one vectorized NumPy test of a
candidate against all kept boxes.

onnxruntime's rules, kept exactly: candidates are the boxes whose score is above the floor (strictly),
taken by score, highest first, ties by lower index; a candidate is suppressed by a kept box when their
intersection is non-empty along x, then y, the intersection area and both areas and the union are
positive and the IoU is above the limit (strictly). All in float32 without fused multiply-adds, the
corners as onnxruntime forms them (min / max of each coordinate pair, or centre -/+ half the size), so
a box on the IoU limit goes the same way.
"""

from __future__ import annotations

import numpy as np

from ..jit import jit


def box_corners(boxes: np.ndarray, center_point_box: bool) -> np.ndarray:
    """[..., 4] float32 as (x_min, y_min, x_max, y_max)."""
    b = boxes.astype(np.float32)
    if center_point_box:  # [x_center, y_center, width, height]
        half_w, half_h = b[..., 2] / np.float32(2), b[..., 3] / np.float32(2)
        return np.stack([b[..., 0] - half_w, b[..., 1] - half_h, b[..., 0] + half_w, b[..., 1] + half_h], axis=-1)
    # [y1, x1, y2, x2], either corner first
    return np.stack([np.minimum(b[..., 1], b[..., 3]), np.minimum(b[..., 0], b[..., 2]),
                     np.maximum(b[..., 1], b[..., 3]), np.maximum(b[..., 0], b[..., 2])], axis=-1)


@jit(fastmath=set())  # no contraction: onnxruntime's float32 products and sums, rounded one by one
def _greedy(corners, order, limit, iou_limit, kept):
    count = 0
    for c in range(order.shape[0]):
        if count >= limit:
            break
        i = order[c]
        x_min, y_min, x_max, y_max = corners[i, 0], corners[i, 1], corners[i, 2], corners[i, 3]
        area = (x_max - x_min) * (y_max - y_min)
        is_kept = True
        for j in range(count):
            k = kept[j]
            inter_x_min, inter_x_max = max(corners[k, 0], x_min), min(corners[k, 2], x_max)
            if inter_x_max <= inter_x_min:
                continue
            inter_y_min, inter_y_max = max(corners[k, 1], y_min), min(corners[k, 3], y_max)
            if inter_y_max <= inter_y_min:
                continue
            inter = (inter_x_max - inter_x_min) * (inter_y_max - inter_y_min)
            kept_area = (corners[k, 2] - corners[k, 0]) * (corners[k, 3] - corners[k, 1])
            union = kept_area + area - inter
            if inter <= 0 or kept_area <= 0 or area <= 0 or union <= 0:
                continue
            if inter / union > iou_limit:
                is_kept = False
                break
        if is_kept:
            kept[count] = i
            count += 1
    return count


def _greedy_numpy(corners, order, limit, iou_limit):
    kept: list[int] = []
    kept_boxes = np.empty((0, 4), np.float32)
    for i in order:
        if len(kept) >= limit:
            break
        box = corners[i]
        area = (box[2] - box[0]) * (box[3] - box[1])
        inter_x_min, inter_x_max = np.maximum(kept_boxes[:, 0], box[0]), np.minimum(kept_boxes[:, 2], box[2])
        inter_y_min, inter_y_max = np.maximum(kept_boxes[:, 1], box[1]), np.minimum(kept_boxes[:, 3], box[3])
        inter = (inter_x_max - inter_x_min) * (inter_y_max - inter_y_min)
        kept_area = (kept_boxes[:, 2] - kept_boxes[:, 0]) * (kept_boxes[:, 3] - kept_boxes[:, 1])
        union = kept_area + area - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            overlaps = ((inter_x_max > inter_x_min) & (inter_y_max > inter_y_min) & (inter > 0) & (kept_area > 0)
                        & (area > 0) & (union > 0) & (inter / union > iou_limit))
        if not overlaps.any():
            kept.append(int(i))
            kept_boxes = np.concatenate([kept_boxes, box[None]])
    return kept


def non_max_suppression(boxes, scores, limit: int, iou_limit: float, floor: float | None, center_point_box: bool):
    """The selected [batch, class, box] triples, int64 [K, 3], in onnxruntime's order."""
    corners = box_corners(boxes, center_point_box)
    iou_limit32 = np.float32(iou_limit)
    compiled = _greedy.get()
    selected = []
    for batch in range(scores.shape[0]):
        batch_corners = np.ascontiguousarray(corners[batch])
        for cls in range(scores.shape[1]):
            s = scores[batch, cls]
            order = np.argsort(-s, kind="stable")
            if floor is not None:
                order = order[s[order] > floor]
            if limit <= 0 or order.size == 0:
                continue
            if compiled is not None:
                kept = np.empty(min(limit, order.size), np.int64)
                kept = kept[:compiled(batch_corners, order.astype(np.int64), int(limit), iou_limit32, kept)]
            else:
                kept = np.asarray(_greedy_numpy(batch_corners, order, limit, iou_limit32), np.int64)
            rows = np.empty((kept.size, 3), np.int64)
            rows[:, 0], rows[:, 1], rows[:, 2] = batch, cls, kept
            selected.append(rows)
    return np.concatenate(selected) if selected else np.zeros((0, 3), np.int64)
