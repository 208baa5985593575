package gradserve

import (
	"encoding/binary"
	"fmt"
	"math"

	pb "gradserve.dev/client/go/gradserve/v1"
)

// A Tensor is a dtype, a shape and its elements, as they travel on the wire: raw little-endian,
// row-major bytes (tensor.proto). Make one with Float32, Float64, Int64 or Bool; read one with
// its Float32s, Float64s, Int64s or Bools method. A Tensor is immutable once made and may be
// shared by goroutines.
type Tensor struct {
	msg *pb.Tensor
}

func numel(shape []int64) (int64, error) {
	n := int64(1)
	for _, s := range shape {
		if s < 0 {
			return 0, fmt.Errorf("gradserve: shape %v has a negative size", shape)
		}
		if s != 0 && n > math.MaxInt64/s {
			return 0, fmt.Errorf("gradserve: shape %v has too many elements", shape)
		}
		n *= s
	}
	return n, nil
}

// shapeFor is shape, or [len] when shape is empty and count is not 1 (a 1-d tensor); a single
// value with no shape is a 0-d (scalar) tensor.
func shapeFor(count int, shape []int64) ([]int64, error) {
	if len(shape) == 0 && count != 1 {
		shape = []int64{int64(count)}
	}
	n, err := numel(shape)
	if err != nil {
		return nil, err
	}
	if n != int64(count) {
		return nil, fmt.Errorf("gradserve: shape %v needs %d values, got %d", shape, n, count)
	}
	return append([]int64(nil), shape...), nil
}

// Float32 is a float32 tensor holding a copy of values with the given shape, outermost
// dimension first. No shape: a 1-d tensor of len(values), or a scalar if there is one value.
// The error says when the shape's element count is not len(values).
func Float32(values []float32, shape ...int64) (Tensor, error) {
	s, err := shapeFor(len(values), shape)
	if err != nil {
		return Tensor{}, err
	}
	data := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return Tensor{&pb.Tensor{Dtype: pb.DType_DTYPE_FLOAT32, Shape: s, Contents: &pb.Tensor_Data{Data: data}}}, nil
}

// Float16 is a float16 tensor of values rounded to IEEE binary16 (to nearest, ties to even, past
// 65504 to infinity), as torch.float16 rounds; see Float32. The server computes it in float32.
func Float16(values []float32, shape ...int64) (Tensor, error) {
	return sixteenBit(pb.DType_DTYPE_FLOAT16, values, shape)
}

// BFloat16 is a bfloat16 tensor of values rounded to bfloat16 (the upper half of a float32, to
// nearest, ties to even), as torch.bfloat16 rounds; see Float32.
func BFloat16(values []float32, shape ...int64) (Tensor, error) {
	return sixteenBit(pb.DType_DTYPE_BFLOAT16, values, shape)
}

// A tensor of dtype d (float16 or bfloat16) of values rounded to d.
func sixteenBit(d pb.DType, values []float32, shape []int64) (Tensor, error) {
	s, err := shapeFor(len(values), shape)
	if err != nil {
		return Tensor{}, err
	}
	bits := bfloat16Bits
	if d == pb.DType_DTYPE_FLOAT16 {
		bits = halfBits
	}
	data := make([]byte, 2*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint16(data[2*i:], bits(v))
	}
	return Tensor{&pb.Tensor{Dtype: d, Shape: s, Contents: &pb.Tensor_Data{Data: data}}}, nil
}

func bfloat16Bits(v float32) uint16 {
	x := math.Float32bits(v)
	if x&0x7FFFFFFF > 0x7F800000 {
		return uint16(x>>16) | 0x0040 // NaN stays a quiet NaN
	}
	return uint16((uint64(x) + 0x7FFF + uint64((x>>16)&1)) >> 16)
}

func halfBits(v float32) uint16 {
	x := math.Float32bits(v)
	sign := uint16(x>>16) & 0x8000
	abs := x & 0x7FFFFFFF
	switch {
	case abs > 0x7F800000:
		return sign | 0x7E00
	case abs >= 0x477FF000: // 65520 and above, and infinity
		return sign | 0x7C00
	case abs < 0x38800000: // below 2^-14: subnormal, or zero below 2^-25
		exponent := abs >> 23
		if exponent < 102 {
			return sign
		}
		mantissa := abs&0x7FFFFF | 0x800000
		shift := 126 - exponent
		m := mantissa >> shift
		rest, halfway := mantissa&(1<<shift-1), uint32(1)<<(shift-1)
		if rest > halfway || rest == halfway && m&1 == 1 {
			m++
		}
		return sign | uint16(m)
	}
	b := (abs>>23-112)<<10 | (abs&0x7FFFFF)>>13
	if rest := abs & 0x1FFF; rest > 0x1000 || rest == 0x1000 && b&1 == 1 {
		b++
	}
	return sign | uint16(b)
}

// The float32 value of 16 bits of dtype d (exact).
func sixteenBitValue(d pb.DType, b uint16) float32 {
	if d == pb.DType_DTYPE_BFLOAT16 {
		return math.Float32frombits(uint32(b) << 16)
	}
	exponent, mantissa := int(b>>10)&0x1F, float64(b&0x3FF)
	var v float64
	switch exponent {
	case 0:
		v = math.Ldexp(mantissa, -24)
	case 31:
		v = math.Inf(1)
		if mantissa != 0 {
			v = math.NaN()
		}
	default:
		v = math.Ldexp(mantissa+1024, exponent-25)
	}
	if b&0x8000 != 0 {
		v = -v
	}
	return float32(v)
}

// Float64 is a float64 tensor; see Float32.
func Float64(values []float64, shape ...int64) (Tensor, error) {
	s, err := shapeFor(len(values), shape)
	if err != nil {
		return Tensor{}, err
	}
	data := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(data[8*i:], math.Float64bits(v))
	}
	return Tensor{&pb.Tensor{Dtype: pb.DType_DTYPE_FLOAT64, Shape: s, Contents: &pb.Tensor_Data{Data: data}}}, nil
}

// Int64 is an int64 tensor (indices, targets); see Float32.
func Int64(values []int64, shape ...int64) (Tensor, error) {
	s, err := shapeFor(len(values), shape)
	if err != nil {
		return Tensor{}, err
	}
	data := make([]byte, 8*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint64(data[8*i:], uint64(v))
	}
	return Tensor{&pb.Tensor{Dtype: pb.DType_DTYPE_INT64, Shape: s, Contents: &pb.Tensor_Data{Data: data}}}, nil
}

// Bool is a bool tensor (masks); see Float32.
func Bool(values []bool, shape ...int64) (Tensor, error) {
	s, err := shapeFor(len(values), shape)
	if err != nil {
		return Tensor{}, err
	}
	data := make([]byte, len(values))
	for i, v := range values {
		if v {
			data[i] = 1
		}
	}
	return Tensor{&pb.Tensor{Dtype: pb.DType_DTYPE_BOOL, Shape: s, Contents: &pb.Tensor_Data{Data: data}}}, nil
}

// FromProto wraps a Tensor message after checking that its contents match its dtype and shape.
// Hand-written `values` are converted to raw data.
func FromProto(m *pb.Tensor) (Tensor, error) {
	if m == nil {
		return Tensor{}, fmt.Errorf("gradserve: no tensor")
	}
	n, err := numel(m.Shape)
	if err != nil {
		return Tensor{}, err
	}
	size := elementSize(m.Dtype)
	if size == 0 {
		return Tensor{}, fmt.Errorf("gradserve: tensor has no valid dtype (%v)", m.Dtype)
	}
	if v := m.GetValues(); v != nil {
		switch m.Dtype {
		case pb.DType_DTYPE_FLOAT32:
			f := make([]float32, len(v.Doubles))
			for i, d := range v.Doubles {
				f[i] = float32(d)
			}
			return Float32(f, m.Shape...)
		case pb.DType_DTYPE_FLOAT64:
			return Float64(v.Doubles, m.Shape...)
		case pb.DType_DTYPE_INT64:
			return Int64(v.Ints, m.Shape...)
		case pb.DType_DTYPE_FLOAT16, pb.DType_DTYPE_BFLOAT16:
			f := make([]float32, len(v.Doubles))
			for i, d := range v.Doubles {
				f[i] = float32(d)
			}
			return sixteenBit(m.Dtype, f, m.Shape)
		default:
			return Bool(v.Bools, m.Shape...)
		}
	}
	if int64(len(m.GetData())) != n*size {
		return Tensor{}, fmt.Errorf("gradserve: tensor of shape %v and dtype %v needs %d bytes, has %d",
			m.Shape, m.Dtype, n*size, len(m.GetData()))
	}
	return Tensor{m}, nil
}

func elementSize(d pb.DType) int64 {
	switch d {
	case pb.DType_DTYPE_FLOAT32:
		return 4
	case pb.DType_DTYPE_FLOAT64, pb.DType_DTYPE_INT64:
		return 8
	case pb.DType_DTYPE_FLOAT16, pb.DType_DTYPE_BFLOAT16:
		return 2
	case pb.DType_DTYPE_BOOL:
		return 1
	}
	return 0
}

// Proto is the tensor's message (shared, not copied: do not change it).
func (t Tensor) Proto() *pb.Tensor { return t.msg }

// DType is the tensor's element type.
func (t Tensor) DType() pb.DType { return t.msg.GetDtype() }

// Shape is a copy of the tensor's sizes, outermost first; empty for a scalar.
func (t Tensor) Shape() []int64 { return append([]int64(nil), t.msg.GetShape()...) }

// Len is the number of elements.
func (t Tensor) Len() int { return len(t.msg.GetData()) / int(max64(elementSize(t.DType()), 1)) }

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func (t Tensor) want(d pb.DType) error {
	if t.msg == nil {
		return fmt.Errorf("gradserve: no tensor")
	}
	if t.msg.Dtype != d {
		return fmt.Errorf("gradserve: tensor is %v, not %v", t.msg.Dtype, d)
	}
	return nil
}

// Float32s is a copy of a float32 tensor's elements in row-major order; an error for another
// dtype (gradients have their input's dtype).
func (t Tensor) Float32s() ([]float32, error) {
	if err := t.want(pb.DType_DTYPE_FLOAT32); err != nil {
		return nil, err
	}
	data := t.msg.GetData()
	out := make([]float32, len(data)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return out, nil
}

// Float64s is a copy of a float64 tensor's elements; see Float32s.
func (t Tensor) Float64s() ([]float64, error) {
	if err := t.want(pb.DType_DTYPE_FLOAT64); err != nil {
		return nil, err
	}
	data := t.msg.GetData()
	out := make([]float64, len(data)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:]))
	}
	return out, nil
}

// Int64s is a copy of an int64 tensor's elements; see Float32s.
func (t Tensor) Int64s() ([]int64, error) {
	if err := t.want(pb.DType_DTYPE_INT64); err != nil {
		return nil, err
	}
	data := t.msg.GetData()
	out := make([]int64, len(data)/8)
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(data[8*i:]))
	}
	return out, nil
}

// Bools is a copy of a bool tensor's elements; see Float32s.
func (t Tensor) Bools() ([]bool, error) {
	if err := t.want(pb.DType_DTYPE_BOOL); err != nil {
		return nil, err
	}
	data := t.msg.GetData()
	out := make([]bool, len(data))
	for i, b := range data {
		out[i] = b != 0
	}
	return out, nil
}

// Floats is a float tensor's elements as float64, whatever its float dtype (float16 and
// bfloat16 exactly).
func (t Tensor) Floats() ([]float64, error) {
	if d := t.DType(); d == pb.DType_DTYPE_FLOAT16 || d == pb.DType_DTYPE_BFLOAT16 {
		data := t.msg.GetData()
		out := make([]float64, len(data)/2)
		for i := range out {
			out[i] = float64(sixteenBitValue(d, binary.LittleEndian.Uint16(data[2*i:])))
		}
		return out, nil
	}
	if t.DType() == pb.DType_DTYPE_FLOAT32 {
		f, err := t.Float32s()
		out := make([]float64, len(f))
		for i, v := range f {
			out[i] = float64(v)
		}
		return out, err
	}
	return t.Float64s()
}

func (t Tensor) String() string {
	return fmt.Sprintf("Tensor(%v, shape %v)", t.DType(), t.msg.GetShape())
}
