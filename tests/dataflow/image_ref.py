#!/usr/bin/env python3
"""towerpack tests: references for the image decoders and augmentors
(tests/dataflow/test_proc_image.c), from tools nobody here wrote: PIL and
OpenCV decode the files, numpy and cv2.resize compute the augmentors.

  image_ref.py gen DIR          write test images into DIR, and for each
                                NAME.EXT a NAME.ref (what PIL / OpenCV decode)
  image_ref.py aug OP IN OUT ARGS...   apply augmentor OP to the image IN
                                with the parameters the test drew, into OUT
  image_ref.py jobs FILE        the same for each line "OP IN OUT ARGS..." of
                                FILE (one interpreter for many checks)

Raw images (.ref, .bin): a text line "H W C\n", then H*W*C bytes.
Exit status 77: a module is missing (the test skips).
"""
import math
import os
import sys

try:
    import numpy as np
    import cv2
    from PIL import Image, ImageOps
except ImportError as e:  # the caller skips with this message
    print("missing python module: %s (apt-get install python3-numpy "
          "python3-opencv python3-pil)" % e)
    sys.exit(77)


def write_raw(path, a):
    a = np.ascontiguousarray(a, dtype=np.uint8)
    h, w = a.shape[:2]
    c = a.shape[2] if a.ndim == 3 else 1
    with open(path, "wb") as f:
        f.write(b"%d %d %d\n" % (h, w, c))
        f.write(a.tobytes())


def read_raw(path):
    with open(path, "rb") as f:
        h, w, c = map(int, f.readline().split())
        a = np.frombuffer(f.read(), dtype=np.uint8).reshape(h, w, c)
    return a


def photo(h, w, seed):
    """A smooth picture with edges and noise, so JPEG has work to do."""
    r = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / 7.0 + seed),
                    128 + 100 * np.cos(y / 5.0),
                    (x * 3 + y * 2) % 256], axis=2)
    img[h // 3: h // 2, w // 4: w // 2] = [250, 20, 40]
    img += r.normal(0, 12, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def gen(d):
    os.makedirs(d, exist_ok=True)
    rgb = photo(45, 61, 1)
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    alpha = np.linspace(0, 255, 45 * 61).reshape(45, 61).astype(np.uint8)

    def ref_pil(name, img):
        write_raw(os.path.join(d, name + ".ref"), np.asarray(img))

    # PNG: exact
    Image.fromarray(grey, "L").save(os.path.join(d, "grey.png"))
    ref_pil("grey", Image.open(os.path.join(d, "grey.png")))
    Image.fromarray(rgb, "RGB").save(os.path.join(d, "rgb.png"))
    ref_pil("rgb", Image.open(os.path.join(d, "rgb.png")))
    rgba = np.dstack([rgb, alpha])
    Image.fromarray(rgba, "RGBA").save(os.path.join(d, "rgba.png"))
    ref_pil("rgba", Image.open(os.path.join(d, "rgba.png")))
    Image.fromarray(np.dstack([grey, alpha]), "LA").save(os.path.join(d, "la.png"))
    ref_pil("la", Image.open(os.path.join(d, "la.png")).convert("RGBA"))
    pal = Image.fromarray(rgb, "RGB").quantize(colors=37)
    pal.save(os.path.join(d, "pal.png"))
    ref_pil("pal", Image.open(os.path.join(d, "pal.png")).convert("RGB"))
    # interlaced (Adam7), through OpenCV's writer
    cv2.imwrite(os.path.join(d, "rgb16.png"),
                (rgb[:, :, ::-1].astype(np.uint16) * 257 + 3))
    a16 = cv2.imread(os.path.join(d, "rgb16.png"), cv2.IMREAD_UNCHANGED)
    write_raw(os.path.join(d, "rgb16.ref"), (a16 >> 8).astype(np.uint8)[:, :, ::-1])
    # mode conversions of PNGs: PIL's convert
    ref_pil("rgb_as_grey", Image.open(os.path.join(d, "rgb.png")).convert("L"))
    ref_pil("grey_as_rgb", Image.open(os.path.join(d, "grey.png")).convert("RGB"))
    ref_pil("rgba_as_rgb", Image.open(os.path.join(d, "rgba.png")).convert("RGB"))

    # JPEG: what PIL decodes (libjpeg-turbo, islow IDCT, fancy upsampling)
    Image.fromarray(rgb).save(os.path.join(d, "q90.jpg"), quality=90)
    ref_pil("q90", Image.open(os.path.join(d, "q90.jpg")))
    Image.fromarray(rgb).save(os.path.join(d, "q95_444.jpg"), quality=95,
                              subsampling=0)
    ref_pil("q95_444", Image.open(os.path.join(d, "q95_444.jpg")))
    Image.fromarray(rgb).save(os.path.join(d, "q75_422.jpg"), quality=75,
                              subsampling=1)
    ref_pil("q75_422", Image.open(os.path.join(d, "q75_422.jpg")))
    Image.fromarray(grey, "L").save(os.path.join(d, "grey.jpg"), quality=90)
    ref_pil("grey_jpg", Image.open(os.path.join(d, "grey.jpg")))
    Image.fromarray(rgb).save(os.path.join(d, "prog.jpg"), quality=85,
                              progressive=True)
    ref_pil("prog", Image.open(os.path.join(d, "prog.jpg")))
    # grey from a colour JPEG: the decoder's luma, as OpenCV's
    # IMREAD_GRAYSCALE asks libjpeg for it
    write_raw(os.path.join(d, "q90_as_grey.ref"),
              cv2.imread(os.path.join(d, "q90.jpg"), cv2.IMREAD_GRAYSCALE))
    # a 1/4 DCT-scaled decode: PIL's draft mode asks libjpeg for the same
    im = Image.open(os.path.join(d, "q90.jpg"))
    big = photo(240, 320, 3)
    Image.fromarray(big).save(os.path.join(d, "big.jpg"), quality=90)
    im = Image.open(os.path.join(d, "big.jpg"))
    im.draft("RGB", (80, 60))
    ref_pil("big_quarter", im)
    # EXIF orientations: PIL's exif_transpose turns them upright
    for o in range(1, 9):
        ex = Image.Exif()
        ex[0x0112] = o
        p = os.path.join(d, "exif%d.jpg" % o)
        Image.fromarray(rgb).save(p, quality=92, exif=ex)
        ref_pil("exif%d" % o, ImageOps.exif_transpose(Image.open(p)))
    # people's own files, as torchvision's loader reads them:
    # Image.open(f).convert('RGB')
    def loader(name):
        return Image.open(os.path.join(d, name)).convert("RGB")
    # CMYK JPEG as PIL (and Photoshop) write it: Adobe, inverted
    cmyk = np.dstack([rgb[:, :, 0], rgb[:, :, 1], rgb[:, :, 2],
                      alpha]).astype(np.uint8)
    Image.fromarray(cmyk, "CMYK").save(os.path.join(d, "cmyk.jpg"), quality=95)
    ref_pil("cmyk", loader("cmyk.jpg"))
    # YCCK (libjpeg's own CMYK encoding): written by the C test beforehand
    if os.path.exists(os.path.join(d, "ycck.jpg")):
        ref_pil("ycck", loader("ycck.jpg"))
    # EXIF orientation 6, not turned (the loader does not)
    ref_pil("exif6_unturned", loader("exif6.jpg"))
    # palette with a transparent entry; 1-bit; grey with tRNS
    pt = Image.fromarray(rgb, "RGB").quantize(colors=37)
    pt.info["transparency"] = 3
    pt.save(os.path.join(d, "pal_trns.png"), transparency=3)
    ref_pil("pal_trns", loader("pal_trns.png"))
    Image.fromarray(grey > 128).save(os.path.join(d, "bw.png"))
    ref_pil("bw", loader("bw.png"))
    Image.fromarray(grey, "L").save(os.path.join(d, "grey_trns.png"),
                                    transparency=7)
    ref_pil("grey_trns", loader("grey_trns.png"))
    # 16-bit grey: PIL opens it as mode I and convert('RGB') clips every
    # value over 255 to white; towerpack keeps the high byte (the picture),
    # as for 16-bit RGB, where PIL does the same
    g16 = grey.astype(np.uint16) * 257
    Image.fromarray(g16).save(os.path.join(d, "grey16.png"))
    assert Image.open(os.path.join(d, "grey16.png")).mode in ("I", "I;16")
    write_raw(os.path.join(d, "grey16_as_rgb.ref"),
              np.dstack([(g16 >> 8).astype(np.uint8)] * 3))
    # a PNG named .jpg: the bytes decide
    Image.fromarray(rgb, "RGB").save(os.path.join(d, "png_named.jpg"), format="PNG")
    ref_pil("png_named", Image.open(os.path.join(d, "png_named.jpg")))
    gen_formats(d, rgb, grey, alpha)


def gen_formats(d, rgb, grey, alpha):
    """The rest of torchvision's IMG_EXTENSIONS (WebP, TIFF, BMP, PGM, PPM),
    written by PIL, and PIL's decode of each: NAME.ref as
    Image.open(f).convert('RGB') ("_rgb"), convert('L') ("_l") or the
    image's own mode (no suffix). Also mixed/CLASS/ for the folder test:
    every format in both classes."""
    def save(name, img, **kw):
        img.save(os.path.join(d, name), **kw)

    def ref(name, refname, mode=None):
        im = Image.open(os.path.join(d, name))
        if mode:
            im = im.convert(mode)
        write_raw(os.path.join(d, refname + ".ref"), np.asarray(im))

    rgba = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    im_rgb = Image.fromarray(rgb, "RGB")
    im_l = Image.fromarray(grey, "L")
    pal = im_rgb.quantize(colors=37)
    # WebP: lossless RGB and RGBA, lossy RGB and RGBA (both sides libwebp)
    save("ll.webp", im_rgb, lossless=True)
    save("ll_rgba.webp", rgba, lossless=True)
    save("q80.webp", im_rgb, quality=80)
    save("q80_rgba.webp", rgba, quality=80)
    # animated: PIL (and towerpack) give the first frame
    save("anim.webp", im_rgb, save_all=True, lossless=True, duration=100,
         append_images=[Image.fromarray(255 - rgb, "RGB")])
    save("anim_rgba.webp", rgba, save_all=True, lossless=True, duration=100,
         append_images=[im_rgb.convert("RGBA")])
    # TIFF: raw, LZW, Deflate, PackBits strips; grey, grey+alpha, RGBA,
    # palette, 1-bit; JPEG-in-TIFF (YCbCr, libtiff's RGBA path); two pages
    save("rgb.tif", im_rgb)
    save("rgb_lzw.tif", im_rgb, compression="tiff_lzw")
    save("rgb_zip.tiff", im_rgb, compression="tiff_adobe_deflate")
    save("grey_pb.tif", im_l, compression="packbits")
    save("la.tif", Image.fromarray(np.dstack([grey, alpha]), "LA"))
    save("rgba.tif", rgba, compression="tiff_lzw")
    save("pal.tif", pal)
    save("bw.tif", Image.fromarray(grey > 128))
    save("bw_g4.tif", Image.fromarray(grey > 100), compression="group4")
    save("jpeg.tif", im_rgb, compression="jpeg", quality=90)
    save("pages.tif", im_rgb, save_all=True, append_images=[im_l.convert("RGB")])
    save("grey16.tif", Image.fromarray(grey.astype(np.uint16) * 257))
    # the Orientation tag, 2 to 8: PIL turns a TIFF by it when it opens it
    from PIL import TiffImagePlugin
    for o in range(2, 9):
        ifd = TiffImagePlugin.ImageFileDirectory_v2()
        ifd[274] = o
        save("orient%d.tif" % o, im_rgb, compression="tiff_lzw", tiffinfo=ifd)
    # BMP: 24-bit, 32-bit, 8-bit palette, 8-bit grey, 1-bit; and top-down
    # (negative height, rows reversed: PIL writes bottom-up only)
    save("rgb.bmp", im_rgb)
    save("rgba.bmp", rgba)
    save("pal.bmp", pal)
    save("grey.bmp", im_l)
    save("bw.bmp", Image.fromarray(grey > 128))
    with open(os.path.join(d, "rgb.bmp"), "rb") as fh:
        b = bytearray(fh.read())
    off = int.from_bytes(b[10:14], "little")
    w = int.from_bytes(b[18:22], "little", signed=True)
    h = int.from_bytes(b[22:26], "little", signed=True)
    stride = (w * 3 + 3) // 4 * 4
    rows = [b[off + i * stride: off + (i + 1) * stride] for i in range(h)]
    b[22:26] = (-h).to_bytes(4, "little", signed=True)
    b[off:off + h * stride] = b"".join(reversed(rows))
    with open(os.path.join(d, "topdown.bmp"), "wb") as fh:
        fh.write(bytes(b))
    # BMP layouts PIL reads but does not write, made byte by byte: 32-bit
    # with an alpha mask in a V5 (BGRA masks) and a V4 header (RGBA
    # masks; PIL: RGBA), 32-bit without bit fields in a V5 header and
    # with three masks after a 40-byte one (PIL: RGB, the fourth byte
    # ignored), 4-bit palette, 16-bit 5-5-5 and 5-6-5
    bmp_hand(d, rgb, alpha)
    # run-length coded BMPs (RLE8, RLE4), which PIL reads but does not
    # write, and the BMPs PIL's reading of which is not the reference
    bmp_rle(d, rgb, grey)
    # TIFF: CMYK strips (raw, LZW), PIL's cmyk2rgb; YCbCr (LZW: PIL reads
    # it through libtiff's RGBA interface). An uncompressed YCbCr TIFF
    # PIL 9.4 cannot read ("image file is truncated": its raw mode wants
    # 4 bytes a pixel); the C test compares that one with the LZW file's
    # reference, the same samples
    cmyk = Image.fromarray(np.dstack([rgb, grey]), "CMYK")
    save("cmyk.tif", cmyk)
    save("cmyk_lzw.tif", cmyk, compression="tiff_lzw")
    ycc = im_rgb.convert("YCbCr")
    save("ycbcr.tif", ycc)
    save("ycbcr_lzw.tif", ycc, compression="tiff_lzw")
    # PGM (P5) and PPM (P6), maxval 255, one with a comment in the header
    save("grey.pgm", im_l)
    save("rgb.ppm", im_rgb)
    with open(os.path.join(d, "rgb.ppm"), "rb") as fh:
        p6 = fh.read()
    with open(os.path.join(d, "comment.ppm"), "wb") as fh:
        fh.write(b"P6\n# made by hand\n" + p6.split(b"\n", 1)[1])
    with open(os.path.join(d, "max4095.pgm"), "wb") as fh:
        fh.write(b"P5 4 2 4095\n" + bytes(16))
    with open(os.path.join(d, "ascii.pgm"), "wb") as fh:
        fh.write(b"P2 2 1 255\n1 2\n")

    for n in ("ll.webp", "q80.webp", "rgb.tif", "rgb_lzw.tif", "rgb_zip.tiff",
              "rgba.tif", "pal.tif", "bw.tif", "bw_g4.tif", "jpeg.tif", "la.tif",
              "pages.tif", "grey_pb.tif", "rgb.bmp", "rgba.bmp", "pal.bmp",
              "grey.bmp", "bw.bmp", "topdown.bmp", "rgb.ppm", "comment.ppm",
              "grey.pgm", "ll_rgba.webp", "q80_rgba.webp", "anim.webp",
              "anim_rgba.webp", "rgba_v5.bmp", "rgba_v4.bmp", "x_v5.bmp",
              "bf32.bmp", "pal4.bmp", "rgb555.bmp", "rgb565.bmp", "cmyk.tif",
              "cmyk_lzw.tif", "ycbcr_lzw.tif", "rle8.bmp", "rle4.bmp",
              "rle8_quirks.bmp", "rle4_quirks.bmp", "rle8_grey.bmp",
              "rle4_grey.bmp", "rle8_topdown.bmp", "z32.bmp", "z32_v5.bmp",
              "pal4_grey17.bmp", "pal8_short.bmp") + tuple(
                  "orient%d.tif" % o for o in range(2, 9)):
        base = n.replace(".", "_")
        ref(n, base + "_rgb", "RGB")
        ref(n, base + "_l", "L")
        ref(n, base + "_rgba", "RGBA")
        ref(n, base)
    # TIFF layouts PIL cannot write: written by the C test beforehand
    for n in ("tiled.tif", "tiled_bl.tif", "planar.tif", "grey4.tif",
              "strips_bl.tif", "tiled_rt.tif", "tiled_lb.tif",
              "cmyk_tiled.tif", "cmyk_planar.tif"):
        if os.path.exists(os.path.join(d, n)):
            base = n.replace(".", "_")
            ref(n, base + "_rgb", "RGB")
            ref(n, base + "_l", "L")
            ref(n, base)
    # the folder: each format in two classes, the classes' pictures apart
    for c, img in (("a", im_rgb), ("b", Image.fromarray(255 - rgb, "RGB"))):
        os.makedirs(os.path.join(d, "mixed", c), exist_ok=True)
        for ext, kw in ((".webp", {"lossless": True}), (".tif", {}),
                        (".tiff", {"compression": "tiff_lzw"}), (".bmp", {}),
                        (".ppm", {}), (".jpg", {"quality": 95}), (".png", {})):
            img.save(os.path.join(d, "mixed", c, "x" + ext), **kw)
        img.convert("L").save(os.path.join(d, "mixed", c, "y.pgm"))
    # folders of one format each, for the source info's channels
    os.makedirs(os.path.join(d, "webponly", "a"), exist_ok=True)
    im_rgb.save(os.path.join(d, "webponly", "a", "z.webp"), lossless=True)
    os.makedirs(os.path.join(d, "pgmonly", "a"), exist_ok=True)
    im_l.save(os.path.join(d, "pgmonly", "a", "z.pgm"))


def bmp_hand(d, rgb, alpha):
    """The BMPs of gen_formats that PIL does not write (BmpImagePlugin
    saves 1, 8, 24-bit and 32-bit BI_RGB only), bottom-up rows."""
    import struct
    h, w = rgb.shape[:2]
    r, g, b = (rgb[..., k].astype(np.uint32) for k in range(3))
    a = alpha.astype(np.uint32)

    def write(name, bpp, comp, hs, masks, px, palette=b""):
        # px: [h, w] of uint32 pixel values (16 or 32 bits) or uint8
        # palette indices (4 bits); rows padded to 4 bytes, bottom-up
        rows = []
        for y in range(h - 1, -1, -1):
            if bpp == 4:
                v = px[y].astype(np.uint8)
                v = np.append(v, 0) if w % 2 else v
                row = ((v[0::2] << 4) | v[1::2]).astype(np.uint8).tobytes()
            else:
                row = px[y].astype("<u%d" % (bpp // 8)).tobytes()
            rows.append(row + b"\0" * (-len(row) % 4))
        hdr = struct.pack("<IiiHHIIiiII", hs, w, h, 1, bpp, comp, 0, 2835,
                          2835, len(palette) // 4, 0)
        if hs > 40:  # V4/V5: four masks, then colour space fields, zero
            hdr += struct.pack("<4I", *masks) + b"\0" * (hs - 56)
        elif comp == 3:  # three masks after a 40-byte header
            hdr += struct.pack("<3I", *masks[:3])
        off = 14 + len(hdr) + len(palette)
        data = b"".join(rows)
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(b"BM" + struct.pack("<IHHI", off + len(data), 0, 0, off) +
                     hdr + palette + data)

    write("rgba_v5.bmp", 32, 3, 124, (0xFF0000, 0xFF00, 0xFF, 0xFF000000),
          (a << 24) | (r << 16) | (g << 8) | b)
    write("rgba_v4.bmp", 32, 3, 108, (0xFF, 0xFF00, 0xFF0000, 0xFF000000),
          (a << 24) | (b << 16) | (g << 8) | r)
    write("x_v5.bmp", 32, 0, 124, (0, 0, 0, 0),
          (a << 24) | (r << 16) | (g << 8) | b)
    write("bf32.bmp", 32, 3, 40, (0xFF0000, 0xFF00, 0xFF, 0),
          (a << 24) | (r << 16) | (g << 8) | b)
    # 4-bit: the picture's 16 levels of red and green picked from a
    # palette of 16 colours (odd width: half a byte of padding)
    idx = ((r >> 6) << 2) | (g >> 6)
    pal = b"".join(bytes((i * 17 % 256, (i >> 2) * 85, (i & 3) * 85, 0))
                   for i in range(16))
    write("pal4.bmp", 4, 0, 40, (), idx, pal)
    write("rgb555.bmp", 16, 0, 40, (),
          ((r >> 3) << 10) | ((g >> 3) << 5) | (b >> 3))
    write("rgb565.bmp", 16, 3, 40, (0xF800, 0x7E0, 0x1F, 0),
          ((r >> 3) << 11) | ((g >> 2) << 5) | (b >> 3))


def bmp_file(name, bpp, comp, w, h, palette, data, hs=40, masks=()):
    """A BMP of a 40-byte (or longer, masks in it) header, its palette
    (RGB tuples, written blue, green, red, 0) and pixel data as given."""
    import struct
    pal = b"".join(bytes((b, g, r, 0)) for (r, g, b) in palette)
    hdr = struct.pack("<IiiHHIIiiII", hs, w, h, 1, bpp, comp, len(data), 2835,
                      2835, len(palette), 0)
    if hs > 40:
        hdr += struct.pack("<4I", *masks) + b"\0" * (hs - 56)
    elif masks:
        hdr += struct.pack("<3I", *masks[:3])
    off = 14 + len(hdr) + len(pal)
    with open(name, "wb") as fh:
        fh.write(b"BM" + struct.pack("<IHHI", off + len(data), 0, 0, off) +
                 hdr + pal + data)


def rle_encode(idx, rle4, even_abs=False):
    """BI_RLE8 / BI_RLE4 data of palette indices idx [h, w], rows
    bottom-up: a run where 3 or more repeat, absolute runs between (of an
    even count when even_abs: PIL 9.4 misreads odd 4-bit ones; a
    leftover pixel becomes a run of 1), end of line, end of bitmap."""
    out = bytearray()
    h, w = idx.shape

    def flush(lit):
        i = 0
        while i < len(lit):
            k = min(len(lit) - i, 254)
            if even_abs and k % 2:
                k -= 1
            if k < 3:
                out.extend((1, lit[i] * 17 if rle4 else lit[i]))
                i += 1
                continue
            chunk = lit[i:i + k] + [0] * (k % 2 if rle4 else 0)
            data = (bytes((chunk[j] << 4) | chunk[j + 1]
                          for j in range(0, len(chunk), 2)) if rle4
                    else bytes(chunk))
            out.extend(bytes((0, k)) + data + b"\0" * (len(data) % 2))
            i += k

    for y in range(h - 1, -1, -1):
        row = [int(v) for v in idx[y]]
        x, lit = 0, []
        while x < w:
            r = 1
            while x + r < w and r < 255 and row[x + r] == row[x]:
                r += 1
            if r >= 3:
                flush(lit)
                lit = []
                out.extend((r, row[x] * 17 if rle4 else row[x]))
                x += r
            else:
                lit.append(row[x])
                x += 1
        flush(lit)
        out.extend((0, 0) if y else (0, 1))
    return bytes(out)


def bmp_rle(d, rgb, grey):
    """Run-length coded BMPs (PIL reads BI_RLE8 and BI_RLE4, writes
    neither), made byte by byte, and the BMPs whose reference is not
    PIL 9.4's decode: NAME_rgb.ref / NAME_l.ref / NAME.ref written here
    from the indices and the palette (checked against OpenCV's decode),
    where PIL 9.4 misreads the file (a delta escape: 9.4 takes the two
    bytes after its offsets; an odd absolute RLE4 run: 9.4 reads a byte
    short; a 4-bit BMP whose palette is the greys 0..15: 9.4 reads the
    packed indices as 8-bit grey). Skipped pixels are index 0, in PIL
    (fixed upstream) and OpenCV alike."""
    import cv2
    j = lambda n: os.path.join(d, n)
    h, w = rgb.shape[:2]
    r, g = (rgb[..., k].astype(np.int64) for k in range(2))
    # RLE8: 37 colours from the picture, runs and absolute runs
    pal = Image.fromarray(rgb, "RGB").quantize(colors=37)
    idx8 = np.asarray(pal)
    pal8 = [tuple(pal.getpalette()[3 * i:3 * i + 3]) for i in range(37)]
    # posterised so that runs are long enough to code as runs
    idx8 = (idx8 // 4 * 4 + (np.arange(w) // 9 % 2)[None, :]) % 37
    bmp_file(j("rle8.bmp"), 8, 1, w, h, pal8, rle_encode(idx8, False))
    # RLE4: 16 colours (as pal4.bmp), even absolute runs
    idx4 = ((r >> 6) << 2) | (g >> 6)
    pal4 = [(i * 17 % 256, (i >> 2) * 85, (i & 3) * 85) for i in range(16)]
    bmp_file(j("rle4.bmp"), 4, 2, w, h, pal4, rle_encode(idx4, True, True))
    # grey: PIL's identity palettes (PIL: "L"), 256 and 16 entries
    bmp_file(j("rle8_grey.bmp"), 8, 1, w, h, [(i, i, i) for i in range(256)],
             rle_encode(grey.astype(np.int64) // 8 * 8, False))
    bmp_file(j("rle4_grey.bmp"), 4, 2, w, h, [(i, i, i) for i in range(16)],
             rle_encode(grey.astype(np.int64) >> 4, True, True))
    # top-down (negative height): PIL reads the rows in the stored order
    bmp_file(j("rle8_topdown.bmp"), 8, 1, w, -h, pal8,
             rle_encode(idx8[::-1], False))
    # the stream's corners PIL 9.4 reads as the format says: a run past
    # the row's end (cut), a whole row then end of line (no empty row),
    # an absolute run past the row's end (it goes on into the next), a
    # run while the column is past the end (nothing), end of line in a
    # row (index 0 to its end), indices past the 10-entry palette (PIL:
    # the grey (i, i, i)), end of bitmap once the pixels are there
    q8 = bytes((9, 3, 0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8, 2, 5, 0, 0,
                2, 200, 4, 4, 0, 1))
    bmp_file(j("rle8_quirks.bmp"), 8, 1, 6, 4, pal8[:10], q8)
    # RLE4: a run of two nibbles (alternating), an even absolute run
    q4 = bytes((5, 0x12, 0, 0, 0, 4, 0x34, 0x56, 1, 0x70, 0, 1))
    bmp_file(j("rle4_quirks.bmp"), 4, 2, 5, 2, pal4, q4)
    # 32-bit, bit fields, all four masks 0: PIL reads BGRA (RGBA)
    bgra = np.dstack([rgb[..., 2], rgb[..., 1], rgb[..., 0], grey])[::-1]
    bmp_file(j("z32.bmp"), 32, 3, w, h, [], bgra.tobytes(), 40, (0, 0, 0))
    bmp_file(j("z32_v5.bmp"), 32, 3, w, h, [], bgra.tobytes(), 124,
             (0, 0, 0, 0))
    # 8-bit, uncompressed, indices past its 10-entry palette (PIL: the
    # grey (i, i, i); stb_image read its uninitialised table there)
    short = grey.astype(np.int64) // 16
    bmp_file(j("pal8_short.bmp"), 8, 0, w, h, pal8[:10],
             b"".join(bytes(row.astype(np.uint8)) + b"\0" * (-w % 4)
                      for row in short[::-1]))
    # 4-bit, a palette of 16 evenly spaced greys: PIL "P" (read right)
    bmp_file(j("pal4_grey17.bmp"), 4, 0, w, h, [(i * 17,) * 3 for i in range(16)],
             pack4(idx4))

    def own(name, idx, palette, grey_out):
        """The reference of a file PIL 9.4 misreads: the palette's pixels
        (past its entries, the grey (i, i, i), as PIL), OpenCV's too."""
        lut = np.array([palette[i] if i < len(palette) else (i, i, i)
                        for i in range(256)], np.uint8)
        px = lut[idx]
        cvd = cv2.imread(j(name), cv2.IMREAD_COLOR)[..., ::-1]
        assert (cvd == px).all(), name
        base = name.replace(".", "_")
        write_raw(j(base + "_rgb.ref"), px)
        write_raw(j(base + "_l.ref"), px[..., 0] if grey_out else
                  np.asarray(Image.fromarray(px, "RGB").convert("L")))
        write_raw(j(base + ".ref"), px[..., 0] if grey_out else px)

    # deltas: (3, 1) from inside a row, (0, 1) at a row's start, (2, 0);
    # the skipped pixels are index 0
    dl = bytes((2, 5, 0, 2, 3, 1, 1, 6, 0, 0, 0, 2, 0, 1, 1, 7, 0, 2, 2, 0,
                3, 8, 0, 1))
    bmp_file(j("rle8_delta.bmp"), 8, 1, 6, 4, pal8[:10], dl)
    own("rle8_delta.bmp", np.array([[7, 0, 0, 8, 8, 8], [0] * 6,
                                    [0, 0, 0, 0, 0, 6], [5, 5, 0, 0, 0, 0]]),
        pal8[:10], False)
    # RLE4 absolute runs of 7 and 5 (odd: a half byte of padding)
    od = bytes((0, 7, 0x12, 0x34, 0x56, 0x70, 0, 0, 0, 5, 0x89, 0xAB, 0xC0, 0,
                2, 0xDD, 0, 1))
    bmp_file(j("rle4_odd.bmp"), 4, 2, 7, 2, pal4, od)
    own("rle4_odd.bmp", np.array([[8, 9, 10, 11, 12, 13, 13],
                                  [1, 2, 3, 4, 5, 6, 7]]), pal4, False)
    # 4-bit, a palette of the greys 0..15 (PIL's "L" test passes, and
    # PIL reads the packed indices as bytes): the palette's greys
    bmp_file(j("pal4_grey.bmp"), 4, 0, w, h, [(i, i, i) for i in range(16)],
             pack4(idx4))
    own("pal4_grey.bmp", idx4, [(i, i, i) for i in range(16)], True)
    # 8-bit, a palette of two entries, black and white (PIL's "1", which
    # unpacks the bytes as bits): black and white
    bw = (grey > 128).astype(np.int64)
    bmp_file(j("pal8_bw.bmp"), 8, 0, w, h, [(0, 0, 0), (255, 255, 255)],
             b"".join(bytes(row.astype(np.uint8)) + b"\0" * (-w % 4)
                      for row in bw[::-1]))
    own("pal8_bw.bmp", bw, [(0, 0, 0), (255, 255, 255)], True)
    # a bitmap that ends early (end of bitmap in the third row): PIL
    # refuses it ("not enough image data"), and so does towerpack
    bmp_file(j("rle8_early.bmp"), 8, 1, 6, 4, pal8[:10],
             bytes((6, 1, 0, 0, 6, 2, 0, 0, 3, 3, 0, 1)))
    try:
        Image.open(j("rle8_early.bmp")).load()
        raise AssertionError("PIL read rle8_early.bmp")
    except ValueError:
        pass


def pack4(idx):
    """4-bit pixel rows, bottom-up, each padded to 4 bytes."""
    h, w = idx.shape
    rows = []
    for y in range(h - 1, -1, -1):
        v = np.append(idx[y], 0) if w % 2 else idx[y]
        row = ((v[0::2] << 4) | v[1::2]).astype(np.uint8).tobytes()
        rows.append(row + b"\0" * (-len(row) % 4))
    return b"".join(rows)


def rnd(x):
    """round half up, then clip to uint8 (towerpack's rounding)"""
    return np.clip(np.floor(x + 0.5), 0, 255).astype(np.uint8)


def grey_of(img):
    f = img.astype(np.float64)
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def motion_kernel(k, deg):
    """a line of length k through the centre at deg degrees (y down),
    rasterised as 4 k points a quarter pixel apart, each in its nearest
    cell, normalised to sum 1"""
    w = np.zeros((k, k), np.float64)
    c = (k - 1) / 2.0
    r = deg * math.pi / 180
    cs, sn = math.cos(r), math.sin(r)
    for i in range(4 * k):
        t = -k * 0.5 + (i + 0.5) * 0.25
        x, y = math.floor(c + t * cs + 0.5), math.floor(c - t * sn + 0.5)
        if 0 <= x < k and 0 <= y < k:
            w[y, x] += 1
    return (w / w.sum()).astype(np.float32)


def aug(op, src, dst, args):
    img = read_raw(src)
    v = [float(a) for a in args]
    f = img.astype(np.float64)
    if op == "resize":  # cv2 is tensorpack's resizer
        h, w = int(v[0]), int(v[1])
        interp = cv2.INTER_NEAREST if len(v) > 2 and v[2] == 0 else cv2.INTER_LINEAR
        out = cv2.resize(img, (w, h), interpolation=interp)
    elif op == "crop-resize":  # y x h w size: GoogleNetRandomCropAndResize
        y, x, h, w, s = (int(a) for a in v)
        out = cv2.resize(np.ascontiguousarray(img[y:y + h, x:x + w]), (s, s),
                         interpolation=cv2.INTER_LINEAR)
    elif op == "center-crop":
        h, w = int(v[0]), int(v[1])
        y0, x0 = int((img.shape[0] - h) * 0.5), int((img.shape[1] - w) * 0.5)
        out = img[y0:y0 + h, x0:x0 + w]
    elif op == "vflip":
        out = img[::-1]
    elif op == "hflip":
        out = img[:, ::-1]
    elif op == "brightness":
        out = rnd(f + v[0])
    elif op == "brightness-scale":
        out = rnd(f * v[0])
    elif op == "contrast":
        m = grey_of(img).mean() if img.shape[2] == 3 else f.mean()
        out = rnd(f * v[0] + m * (1 - v[0]))
    elif op == "saturation":
        g = grey_of(img)[..., None]
        out = rnd(f * v[0] + g * (1 - v[0]))
    elif op == "hue":  # tensorpack's Hue on OpenCV's 8-bit HSV
        hsv = cv2.cvtColor(img, cv2.COLOR_RGB2HSV)
        hsv[..., 0] = (hsv[..., 0] + v[0]) % 180
        out = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    elif op == "lighting":  # v: the three per-channel increments
        out = rnd(f + np.array(v[:3]).reshape(1, 1, 3))
    elif op == "rotation":  # cx cy deg: tensorpack's Rotation matrix, cv2's warp
        cx, cy, deg = v
        m = cv2.getRotationMatrix2D((cx - 0.5, cy - 0.5), deg, 1)
        out = cv2.warpAffine(img, m, img.shape[1::-1], flags=cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_REPLICATE)
    elif op == "affine":  # the 2x3 matrix tensorpack's Affine builds
        m = np.array(v[:6], dtype=np.float64).reshape(2, 3)
        out = cv2.warpAffine(img, m, img.shape[1::-1], flags=cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_REPLICATE)
    elif op == "gaussian-blur":  # k sigma
        k, sig = int(v[0]), v[1]
        out = cv2.GaussianBlur(img, (k, k), sigmaX=sig, sigmaY=sig,
                               borderType=cv2.BORDER_REPLICATE)
    elif op == "motion-blur":  # k deg: the line kernel, cv2.filter2D
        k, deg = int(v[0]), v[1]
        out = cv2.filter2D(img, -1, motion_kernel(k, deg),
                           borderType=cv2.BORDER_REPLICATE)
    elif op == "mean-var-channels":  # MeanVarianceNormalize(all_channel=False)
        m = f.mean(axis=(0, 1), keepdims=True)
        sd = np.maximum(f.std(axis=(0, 1), keepdims=True), 1.0 / np.sqrt(np.prod(f.shape)))
        out = rnd((f - m) / sd * 16 + 128)
    elif op == "min-max-channels":  # lo hi: MinMaxNormalize(all_channel=False)
        mn = f.min(axis=(0, 1), keepdims=True)
        mx = f.max(axis=(0, 1), keepdims=True)
        out = rnd((f - mn) / (mx - mn) * (v[1] - v[0]) + v[0])
    elif op == "mean-var":  # float32 out: compared after x * 16 + 128
        m, sd = f.mean(), max(f.std(), 1.0 / np.sqrt(f.size))
        out = rnd((f - m) / sd * 16 + 128)
    elif op == "grey":
        g = rnd(grey_of(img))[..., None]
        out = np.repeat(g, 3, axis=2)
    else:
        print("unknown op", op)
        return 2
    if out.ndim == 2:
        out = out[..., None]
    write_raw(dst, out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "gen":
        gen(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "jobs":
        # one augmentor reference a line: OP IN OUT ARGS...
        for line in open(sys.argv[2]):
            w = line.split()
            if w and aug(w[0], w[1], w[2], w[3:]) != 0:
                sys.exit(1)
        sys.exit(0)
    if len(sys.argv) >= 5 and sys.argv[1] == "aug":
        sys.exit(aug(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))
    print(__doc__)
    sys.exit(2)
