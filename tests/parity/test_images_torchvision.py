"""Parity of dtrain's image decoding and transforms with PIL and torchvision 0.14 (Debian's python3-torchvision).

Drives tests/parity/dump_image.c on images this test writes (PNG: RGB, grey, palette, RGBA; JPEG: RGB, grey)
and compares, on the same decoded image and the same parameters:
  - decoding: dtrain's RGB pixels == PIL's Image.open(f).convert("RGB"), exactly (both use libjpeg-turbo, libpng);
  - ToTensor + Normalize (with and without a horizontal flip): exactly, bit for bit;
  - RandomCrop's zero padding + crop and CenterCrop (smaller and larger than the image): exactly;
  - bilinear resize, resized_crop and Resize(shorter side): against torchvision's resize of the uint8 tensor with
    antialias=False (interpolate, align_corners=False, rounded), within 1 intensity level (most pixels equal).
    The difference to PIL's antialiased bilinear (what torchvision's PIL pipeline does) is printed, not asserted.
Exit 77 when torchvision or PIL is missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image
except ImportError as e:  # optional dependency: skip
    print(f"skipped: {e}")
    sys.exit(77)

BUILD = os.environ.get("DT_BUILD_DIR", "build")
TOOL = os.path.join(BUILD, "tests", "dump_image")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def dump(img, op, *args):
    out = os.path.join(tmp, "out.bin")
    r = subprocess.run([TOOL, img, out, op, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"dump_image {op}: {r.stderr}")
    h, w = map(int, r.stdout.split())
    raw = open(out, "rb").read()
    if op == "tensor":
        return torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).view(3, h, w)
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()).view(h, w, 3).permute(2, 0, 1)


def pil_rgb(path):
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


def image(h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (h + w)], -1)
    return np.clip(base + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)


tmp = tempfile.mkdtemp(prefix="dt_img_parity_")
files = {}
rgb = image(53, 67, 1)
files["rgb.png"] = Image.fromarray(rgb)
files["gray.png"] = Image.fromarray(rgb[..., 0])
files["palette.png"] = Image.fromarray(rgb).quantize(37)
files["rgba.png"] = Image.fromarray(np.concatenate([rgb, rgb[..., :1]], -1), "RGBA")
files["rgb.jpg"] = Image.fromarray(image(61, 83, 2))
files["gray.jpg"] = Image.fromarray(image(40, 30, 3)[..., 1])
files["big.jpg"] = Image.fromarray(image(300, 400, 4))
for name, im in files.items():
    im.save(os.path.join(tmp, name), quality=90) if name.endswith(".jpg") else im.save(os.path.join(tmp, name))

# decoding, and ToTensor + Normalize with and without flip
mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
for name in files:
    path = os.path.join(tmp, name)
    ref = F.pil_to_tensor(pil_rgb(path))
    ours = dump(path, "decode")
    check(torch.equal(ours, ref), f"decode {name} == PIL convert('RGB')")
for flip in (0, 1):
    path = os.path.join(tmp, "rgb.jpg")
    pil = pil_rgb(path)
    ref = T.Normalize(mean, std)(T.ToTensor()(F.hflip(pil) if flip else pil))
    ours = dump(path, "tensor", flip, *mean, *std)
    check(torch.equal(ours, ref), f"ToTensor + Normalize{' + hflip' if flip else ''}: bit for bit")

# RandomCrop(32, padding=4) for several positions, and CenterCrop smaller and larger than the image
path = os.path.join(tmp, "rgb.png")
pil = pil_rgb(path)
padded = F.pad(pil, 4, fill=0)
ok = True
for i, j in [(0, 0), (8, 8), (3, 41), (29, 43), (13, 0)]:
    ref = F.pil_to_tensor(F.crop(padded, i, j, 32, 32))
    ok &= torch.equal(dump(path, "crop", i - 4, j - 4, 32, 32), ref)
check(ok, "RandomCrop(32, padding=4) for the same (i, j): exact")
for size in (32, 50, 60, 71):
    ref = F.pil_to_tensor(F.center_crop(pil, size))
    check(torch.equal(dump(path, "center", size), ref), f"CenterCrop({size}) of 67x53: exact")

# bilinear resize vs torchvision's tensor resize with antialias=False
def close(ours, ref, what):
    d = (ours.int() - ref.int()).abs()
    same = (d == 0).float().mean().item()
    check(ours.shape == ref.shape and d.max().item() <= 1,
          f"{what}: max diff {d.max().item()} (<= 1), {100 * same:.2f}% of values equal")


big = os.path.join(tmp, "big.jpg")
t = F.pil_to_tensor(pil_rgb(big))
for oh, ow in [(224, 224), (150, 200), (512, 301), (37, 61)]:
    close(dump(big, "resize", oh, ow), F.resize(t, [oh, ow], antialias=False), f"resize 400x300 -> {ow}x{oh}")
for i, j, ch, cw in [(10, 20, 100, 150), (0, 0, 300, 400), (250, 390, 50, 10), (17, 33, 224, 224)]:
    close(dump(big, "resized_crop", i, j, ch, cw, 224), F.resized_crop(t, i, j, ch, cw, [224, 224], antialias=False),
          f"resized_crop({i}, {j}, {ch}, {cw}) -> 224")
close(dump(big, "resize_shorter", 256), F.resize(t, 256, antialias=False), "Resize(256) of 400x300")
small = os.path.join(tmp, "rgb.jpg")
ts = F.pil_to_tensor(pil_rgb(small))
close(dump(small, "resize_shorter", 256), F.resize(ts, 256, antialias=False), "Resize(256) of 83x61 (upscale)")
# for the record: PIL's antialiased bilinear (torchvision's PIL pipeline)
for oh, ow in [(224, 224), (512, 301)]:
    d = (dump(big, "resize", oh, ow).int() - F.pil_to_tensor(F.resize(pil_rgb(big), [oh, ow])).int()).abs().float()
    print(f"info: resize 400x300 -> {ow}x{oh} vs PIL bilinear (antialiased): mean |diff| {d.mean():.2f}, max {d.max():.0f}")

subprocess.run(["rm", "-rf", tmp])
if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("all passed")
