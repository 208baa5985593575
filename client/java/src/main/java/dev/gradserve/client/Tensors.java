package dev.gradserve.client;

import com.google.protobuf.ByteString;
import dev.gradserve.v1.DType;
import dev.gradserve.v1.Tensor;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.List;

/**
 * Tensors on the wire: a dtype, a shape and raw little-endian row-major bytes (tensor.proto).
 *
 * <p>Make one with {@link #float32}, {@link #float64}, {@link #float16}, {@link #bfloat16},
 * {@link #int64} or {@link #bool} from an array and a shape (outermost first; none: 1-d, or a
 * scalar for one value), read one with {@link #toFloats}, {@link #toDoubles}, {@link #toLongs} or
 * {@link #toBooleans}. Mistakes (a shape that does not match the values, the wrong dtype) throw
 * IllegalArgumentException. The methods are pure and thread-safe.
 */
public final class Tensors {
  private Tensors() {}

  static long[] shapeFor(int count, long[] shape) {
    if (shape.length == 0 && count != 1) {
      shape = new long[] {count};
    }
    long n = 1;
    for (long s : shape) {
      if (s < 0) {
        throw new IllegalArgumentException("shape " + Arrays.toString(shape) + " has a negative size");
      }
      n = Math.multiplyExact(n, s);
    }
    if (n != count) {
      throw new IllegalArgumentException(
          "shape " + Arrays.toString(shape) + " needs " + n + " values, got " + count);
    }
    return shape;
  }

  private static Tensor make(DType dtype, long[] shape, ByteBuffer data) {
    data.flip();
    Tensor.Builder t = Tensor.newBuilder().setDtype(dtype).setData(ByteString.copyFrom(data));
    for (long s : shape) {
      t.addShape(s);
    }
    return t.build();
  }

  private static ByteBuffer buffer(int bytes) {
    return ByteBuffer.allocate(bytes).order(ByteOrder.LITTLE_ENDIAN);
  }

  /** A float32 tensor holding a copy of values. */
  public static Tensor float32(float[] values, long... shape) {
    long[] s = shapeFor(values.length, shape);
    ByteBuffer b = buffer(4 * values.length);
    b.asFloatBuffer().put(values);
    b.position(4 * values.length);
    return make(DType.DTYPE_FLOAT32, s, b);
  }

  /**
   * A float16 tensor of values rounded to IEEE binary16 (to nearest, ties to even, past 65504 to
   * infinity), as torch.float16 rounds. The server computes it in float32.
   */
  public static Tensor float16(float[] values, long... shape) {
    return sixteenBit(DType.DTYPE_FLOAT16, values, shape);
  }

  /**
   * A bfloat16 tensor of values rounded to bfloat16 (the upper half of a float32, to nearest,
   * ties to even), as torch.bfloat16 rounds.
   */
  public static Tensor bfloat16(float[] values, long... shape) {
    return sixteenBit(DType.DTYPE_BFLOAT16, values, shape);
  }

  private static Tensor sixteenBit(DType dtype, float[] values, long[] shape) {
    long[] s = shapeFor(values.length, shape);
    ByteBuffer b = buffer(2 * values.length);
    for (float v : values) {
      b.putShort(dtype == DType.DTYPE_FLOAT16 ? halfBits(v) : bfloat16Bits(v));
    }
    return make(dtype, s, b);
  }

  static short bfloat16Bits(float v) {
    long x = Float.floatToRawIntBits(v) & 0xFFFFFFFFL;
    if ((x & 0x7FFFFFFFL) > 0x7F800000L) {
      return (short) ((x >>> 16) | 0x0040); // NaN stays a quiet NaN
    }
    return (short) ((x + 0x7FFF + ((x >>> 16) & 1)) >>> 16);
  }

  static short halfBits(float v) {
    int x = Float.floatToRawIntBits(v);
    int sign = (x >>> 16) & 0x8000;
    int abs = x & 0x7FFFFFFF;
    if (abs > 0x7F800000) {
      return (short) (sign | 0x7E00);
    }
    if (abs >= 0x477FF000) { // 65520 and above, and infinity
      return (short) (sign | 0x7C00);
    }
    if (abs < 0x38800000) { // below 2^-14: subnormal, or zero below 2^-25
      int exponent = abs >>> 23;
      if (exponent < 102) {
        return (short) sign;
      }
      int mantissa = (abs & 0x7FFFFF) | 0x800000;
      int shift = 126 - exponent;
      int m = mantissa >>> shift;
      int rest = mantissa & ((1 << shift) - 1);
      int halfway = 1 << (shift - 1);
      if (rest > halfway || (rest == halfway && (m & 1) == 1)) {
        m++;
      }
      return (short) (sign | m);
    }
    int bits = (((abs >>> 23) - 112) << 10) | ((abs & 0x7FFFFF) >>> 13);
    int rest = abs & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (bits & 1) == 1)) {
      bits++;
    }
    return (short) (sign | bits);
  }

  /** The value of 16 bits of a float16 or bfloat16 tensor (exact). */
  static float sixteenBitValue(DType dtype, short bits) {
    int b = bits & 0xFFFF;
    if (dtype == DType.DTYPE_BFLOAT16) {
      return Float.intBitsToFloat(b << 16);
    }
    int exponent = (b >>> 10) & 0x1F;
    int mantissa = b & 0x3FF;
    double v;
    if (exponent == 0) {
      v = Math.scalb((double) mantissa, -24);
    } else if (exponent == 31) {
      v = mantissa != 0 ? Double.NaN : Double.POSITIVE_INFINITY;
    } else {
      v = Math.scalb((double) (mantissa | 0x400), exponent - 25);
    }
    return (float) ((b & 0x8000) != 0 ? -v : v);
  }

  /** A float64 tensor holding a copy of values. */
  public static Tensor float64(double[] values, long... shape) {
    long[] s = shapeFor(values.length, shape);
    ByteBuffer b = buffer(8 * values.length);
    b.asDoubleBuffer().put(values);
    b.position(8 * values.length);
    return make(DType.DTYPE_FLOAT64, s, b);
  }

  /** An int64 tensor (indices, targets) holding a copy of values. */
  public static Tensor int64(long[] values, long... shape) {
    long[] s = shapeFor(values.length, shape);
    ByteBuffer b = buffer(8 * values.length);
    b.asLongBuffer().put(values);
    b.position(8 * values.length);
    return make(DType.DTYPE_INT64, s, b);
  }

  /** A bool tensor (masks) holding a copy of values. */
  public static Tensor bool(boolean[] values, long... shape) {
    long[] s = shapeFor(values.length, shape);
    ByteBuffer b = buffer(values.length);
    for (boolean v : values) {
      b.put((byte) (v ? 1 : 0));
    }
    return make(DType.DTYPE_BOOL, s, b);
  }

  /** The tensor's shape as an array. */
  public static long[] shape(Tensor t) {
    List<Long> s = t.getShapeList();
    return s.stream().mapToLong(Long::longValue).toArray();
  }

  private static ByteBuffer data(Tensor t, DType want, int size) {
    if (t.getDtype() != want) {
      throw new IllegalArgumentException("tensor is " + t.getDtype() + ", not " + want);
    }
    if (t.hasValues()) {
      throw new IllegalArgumentException("tensor has hand-written values, not data");
    }
    ByteBuffer b = t.getData().asReadOnlyByteBuffer().order(ByteOrder.LITTLE_ENDIAN);
    if (b.remaining() % size != 0) {
      throw new IllegalArgumentException("tensor data is not a whole number of elements");
    }
    return b;
  }

  /** A float32 tensor's elements in row-major order. */
  public static float[] toFloats(Tensor t) {
    ByteBuffer b = data(t, DType.DTYPE_FLOAT32, 4);
    float[] out = new float[b.remaining() / 4];
    b.asFloatBuffer().get(out);
    return out;
  }

  /** A float tensor's elements as doubles, whatever its float dtype (16-bit ones exactly). */
  public static double[] toDoubles(Tensor t) {
    if (t.getDtype() == DType.DTYPE_FLOAT16 || t.getDtype() == DType.DTYPE_BFLOAT16) {
      ByteBuffer b = data(t, t.getDtype(), 2);
      double[] out = new double[b.remaining() / 2];
      for (int i = 0; i < out.length; i++) {
        out[i] = sixteenBitValue(t.getDtype(), b.getShort());
      }
      return out;
    }
    if (t.getDtype() == DType.DTYPE_FLOAT32) {
      float[] f = toFloats(t);
      double[] out = new double[f.length];
      for (int i = 0; i < f.length; i++) {
        out[i] = f[i];
      }
      return out;
    }
    ByteBuffer b = data(t, DType.DTYPE_FLOAT64, 8);
    double[] out = new double[b.remaining() / 8];
    b.asDoubleBuffer().get(out);
    return out;
  }

  /** An int64 tensor's elements. */
  public static long[] toLongs(Tensor t) {
    ByteBuffer b = data(t, DType.DTYPE_INT64, 8);
    long[] out = new long[b.remaining() / 8];
    b.asLongBuffer().get(out);
    return out;
  }

  /** A bool tensor's elements. */
  public static boolean[] toBooleans(Tensor t) {
    ByteBuffer b = data(t, DType.DTYPE_BOOL, 1);
    boolean[] out = new boolean[b.remaining()];
    for (int i = 0; i < out.length; i++) {
      out[i] = b.get() != 0;
    }
    return out;
  }
}
