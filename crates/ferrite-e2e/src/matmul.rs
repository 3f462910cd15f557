//! The `matmul_test` module imported by upstream's generated matmul e2e
//! programs (`tests/e2e/matmul`): random input matrices and a host
//! reference matmul to check results against.
//!
//! | function                     | cconv           | arguments                                        |
//! |------------------------------|-----------------|--------------------------------------------------|
//! | `generate_random_matrix`     | `0rIIii_r`      | device, dim0, dim1, element type, seed           |
//! | `generate_random_matrix_3d`  | `0rIIIii_r`     | device, dim0, dim1, dim2, element type, seed     |
//! | `check_matmul_results`       | `0rIIIirrrr_v`  | device, m, k, n, transpose_rhs, lhs, rhs, acc (may be null), actual |
//! | `check_batch_matmul_results` | `0rIIIIirrrr_v` | device, batch, m, k, n, transpose_rhs, lhs, rhs, acc, actual |
//!
//! The reference accumulates in the accumulator's arithmetic type (f32 for
//! f32/f16/bf16/f8 inputs, f64, wrapping i32 for integers) in k order, and
//! rounds to the result type once at the end. A disagreeing element fails
//! the call (`ABORTED`) with a message naming its row and column and
//! printing the surrounding windows of the inputs, the expected and the
//! actual result; the window is 16×16×16, or the sizes in the environment
//! variables `IREE_MATMUL_TEST_SHOW_CONTEXT_{M,N,K}`.

use std::fmt::Write as _;
use std::sync::Arc;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result, Status, StatusCode};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::numerics;
use ferrite_hal::{BufferView, ElementType};
use ferrite_vm::native::{ArgReader, NativeModule, NativeModuleBuilder};
use ferrite_vm::refs::Ref;
use ferrite_vm::stack::NativePoll;

use super::{
    agree, dim_arg, downcast, expect_len, generate_random_call, highlight, is_int, read_view,
    E2eOptions, Value,
};

/// The module's name, as the generated programs import it.
pub const MATMUL_TEST_MODULE_NAME: &str = "matmul_test";

/// Builds the `matmul_test` module comparing results under `opts`.
pub fn create_matmul_test_module(opts: E2eOptions) -> Result<Arc<NativeModule>> {
    let b = NativeModuleBuilder::new(MATMUL_TEST_MODULE_NAME, 0);
    let b = b.function(
        "generate_random_matrix",
        "0rIIii_r",
        generate_random_call::<2>,
    )?;
    let b = b.function(
        "generate_random_matrix_3d",
        "0rIIIii_r",
        generate_random_call::<3>,
    )?;
    let b = b.function("check_matmul_results", "0rIIIirrrr_v", move |c| {
        let mut a = ArgReader::new(c);
        let device = device_arg(a.a_ref()?)?;
        let (m, k, n) = (
            dim_arg(a.i64()?, "m")?,
            dim_arg(a.i64()?, "k")?,
            dim_arg(a.i64()?, "n")?,
        );
        let transpose_rhs = a.i32()? != 0;
        let views = read_operands(&mut a)?;
        let problem = MatmulProblem::from_views(m, k, n, transpose_rhs, &views)?;
        let data = views.download(&device, 1, &problem)?;
        problem.check(&opts, &data.batch(0, &problem))?;
        Ok(NativePoll::Ready(Vec::new()))
    })?;
    let b = b.function("check_batch_matmul_results", "0rIIIIirrrr_v", move |c| {
        let mut a = ArgReader::new(c);
        let device = device_arg(a.a_ref()?)?;
        let batch = dim_arg(a.i64()?, "batch")?;
        let (m, k, n) = (
            dim_arg(a.i64()?, "m")?,
            dim_arg(a.i64()?, "k")?,
            dim_arg(a.i64()?, "n")?,
        );
        let transpose_rhs = a.i32()? != 0;
        let views = read_operands(&mut a)?;
        let problem = MatmulProblem::from_views(m, k, n, transpose_rhs, &views)?;
        let data = views.download(&device, batch, &problem)?;
        for b in 0..batch {
            problem
                .check(&opts, &data.batch(b, &problem))
                .annotate(|| format!("batch {b} of {batch}"))?;
        }
        Ok(NativePoll::Ready(Vec::new()))
    })?;
    Ok(b.build())
}

fn device_arg(r: Ref) -> Result<DeviceRef> {
    downcast::<DeviceRef>(&r, "device")
}

/// The buffer views passed to a check function.
struct Operands {
    lhs: BufferView,
    rhs: BufferView,
    acc: Option<BufferView>,
    actual: BufferView,
}

fn read_operands(a: &mut ArgReader<'_>) -> Result<Operands> {
    let lhs = downcast::<BufferView>(&a.a_ref().annotate(|| "lhs".to_string())?, "lhs")?;
    let rhs = downcast::<BufferView>(&a.a_ref().annotate(|| "rhs".to_string())?, "rhs")?;
    let acc = match a.opt_ref()? {
        None => None,
        Some(r) => Some(downcast::<BufferView>(&r, "acc")?),
    };
    let actual = downcast::<BufferView>(
        &a.a_ref().annotate(|| "actual_result".to_string())?,
        "actual_result",
    )?;
    Ok(Operands {
        lhs,
        rhs,
        acc,
        actual,
    })
}

/// Host copies of all batches of the operands.
struct Downloaded {
    lhs: Vec<u8>,
    rhs: Vec<u8>,
    acc: Option<Vec<u8>>,
    actual: Vec<u8>,
}

impl Operands {
    fn download(&self, device: &DeviceRef, batch: u64, p: &MatmulProblem) -> Result<Downloaded> {
        let lhs = read_view(Some(device), &self.lhs)?;
        let rhs = read_view(Some(device), &self.rhs)?;
        let acc = match &self.acc {
            Some(v) => Some(read_view(Some(device), v)?),
            None => None,
        };
        let actual = read_view(Some(device), &self.actual)?;
        expect_len(&lhs, batch * p.m * p.k, p.lhs_type, "lhs")?;
        expect_len(&rhs, batch * p.k * p.n, p.rhs_type, "rhs")?;
        if let Some(acc) = &acc {
            expect_len(acc, batch * p.m * p.n, p.acc_type, "acc")?;
        }
        expect_len(&actual, batch * p.m * p.n, p.acc_type, "actual_result")?;
        Ok(Downloaded {
            lhs,
            rhs,
            acc,
            actual,
        })
    }
}

/// One batch's slices of [`Downloaded`].
struct MatmulData<'a> {
    lhs: &'a [u8],
    rhs: &'a [u8],
    acc: Option<&'a [u8]>,
    actual: &'a [u8],
}

impl Downloaded {
    /// Batch `b`'s slices; [`Operands::download`] checked the lengths.
    fn batch(&self, b: u64, p: &MatmulProblem) -> MatmulData<'_> {
        let range = |count: u64, et: ElementType| {
            let len = (count * et.element_byte_count() as u64) as usize;
            b as usize * len..(b as usize + 1) * len
        };
        let acc_range = range(p.m * p.n, p.acc_type);
        MatmulData {
            lhs: &self.lhs[range(p.m * p.k, p.lhs_type)],
            rhs: &self.rhs[range(p.k * p.n, p.rhs_type)],
            acc: self.acc.as_deref().map(|a| &a[acc_range.clone()]),
            actual: &self.actual[acc_range],
        }
    }
}

/// Reads element `i` of a float-family buffer as f32.
type LoadF32 = fn(&[u8], usize) -> f32;

fn load_f32(et: ElementType) -> Option<LoadF32> {
    fn b2(d: &[u8], i: usize) -> u16 {
        u16::from_le_bytes([d[2 * i], d[2 * i + 1]])
    }
    Some(match et {
        ElementType::FLOAT_32 => {
            |d, i| f32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]])
        }
        ElementType::FLOAT_16 => |d, i| numerics::f16_to_f32(b2(d, i)),
        ElementType::BFLOAT_16 => |d, i| numerics::bf16_to_f32(b2(d, i)),
        ElementType::FLOAT_8_E5M2 => |d, i| numerics::f8e5m2_to_f32(d[i]),
        ElementType::FLOAT_8_E4M3_FN => |d, i| numerics::f8e4m3fn_to_f32(d[i]),
        ElementType::FLOAT_8_E5M2_FNUZ => |d, i| numerics::f8e5m2fnuz_to_f32(d[i]),
        ElementType::FLOAT_8_E4M3_FNUZ => |d, i| numerics::f8e4m3fnuz_to_f32(d[i]),
        _ => return None,
    })
}

/// Stores an f32 accumulator as element `i` of an f32, f16 or bf16 buffer.
fn store_f32(et: ElementType, d: &mut [u8], i: usize, v: f32) {
    match et {
        ElementType::FLOAT_16 => {
            d[2 * i..2 * i + 2].copy_from_slice(&numerics::f32_to_f16(v).to_le_bytes())
        }
        ElementType::BFLOAT_16 => {
            d[2 * i..2 * i + 2].copy_from_slice(&numerics::f32_to_bf16(v).to_le_bytes())
        }
        _ => d[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
    }
}

fn read_i32(d: &[u8], i: usize) -> i32 {
    i32::from_le_bytes([d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]])
}

fn read_f64(d: &[u8], i: usize) -> f64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[8 * i..8 * i + 8]);
    f64::from_le_bytes(b)
}

/// The arithmetic of the reference for a combination of element types.
#[derive(Clone, Copy)]
enum Arith {
    /// Float-family inputs widened to f32, f32 accumulation.
    F32 {
        lhs: LoadF32,
        rhs: LoadF32,
        acc: LoadF32,
    },
    /// f64 throughout.
    F64,
    /// Integer inputs (8-bit, the LHS possibly unsigned, or 32-bit),
    /// wrapping i32 accumulation.
    I32 { bits: u32, lhs_unsigned: bool },
}

/// A matmul's sizes and types, and the reference arithmetic they select.
struct MatmulProblem {
    m: u64,
    k: u64,
    n: u64,
    transpose_rhs: bool,
    lhs_type: ElementType,
    rhs_type: ElementType,
    /// The result's (and accumulator's) element type.
    acc_type: ElementType,
    arith: Arith,
}

impl MatmulProblem {
    fn from_views(
        m: u64,
        k: u64,
        n: u64,
        transpose_rhs: bool,
        v: &Operands,
    ) -> Result<MatmulProblem> {
        let (lhs_type, rhs_type, acc_type) = (
            v.lhs.element_type(),
            v.rhs.element_type(),
            v.actual.element_type(),
        );
        if let Some(acc) = &v.acc {
            if acc.element_type() != acc_type {
                bail!(
                    InvalidArgument,
                    "acc has element type {} but actual_result has {acc_type}",
                    acc.element_type()
                );
            }
        }
        let arith = match (lhs_type, rhs_type, acc_type) {
            (ElementType::FLOAT_64, ElementType::FLOAT_64, ElementType::FLOAT_64) => Arith::F64,
            (ElementType::UINT_8, r, a) if is_int(r, 8) && is_int(a, 32) => Arith::I32 {
                bits: 8,
                lhs_unsigned: true,
            },
            (l, r, a) if is_int(l, 8) && is_int(r, 8) && is_int(a, 32) => Arith::I32 {
                bits: 8,
                lhs_unsigned: false,
            },
            (l, r, a) if is_int(l, 32) && is_int(r, 32) && is_int(a, 32) => Arith::I32 {
                bits: 32,
                lhs_unsigned: false,
            },
            (l, r, a)
                if l == r
                    && (a == ElementType::FLOAT_32
                        || (a == l
                            && matches!(a, ElementType::FLOAT_16 | ElementType::BFLOAT_16))) =>
            {
                match (load_f32(l), load_f32(a)) {
                    (Some(lhs), Some(acc)) => Arith::F32 { lhs, rhs: lhs, acc },
                    _ => unhandled(l, r, a)?,
                }
            }
            (l, r, a) => unhandled(l, r, a)?,
        };
        Ok(MatmulProblem {
            m,
            k,
            n,
            transpose_rhs,
            lhs_type,
            rhs_type,
            acc_type,
            arith,
        })
    }

    /// Computes result element (m, n) into `expected`.
    fn reference_element(&self, d: &MatmulData<'_>, expected: &mut [u8], m: u64, n: u64) {
        let (ks, ns) = (self.k as usize, self.n as usize);
        let (m, n) = (m as usize, n as usize);
        let out = n + m * ns;
        let rhs_index = |k: usize| {
            if self.transpose_rhs {
                k + n * ks
            } else {
                n + k * ns
            }
        };
        match self.arith {
            Arith::F32 { lhs, rhs, acc } => {
                let mut sum = d.acc.map_or(0.0, |a| acc(a, out));
                for k in 0..ks {
                    sum += lhs(d.lhs, k + m * ks) * rhs(d.rhs, rhs_index(k));
                }
                store_f32(self.acc_type, expected, out, sum);
            }
            Arith::F64 => {
                let mut sum = d.acc.map_or(0.0, |a| read_f64(a, out));
                for k in 0..ks {
                    sum += read_f64(d.lhs, k + m * ks) * read_f64(d.rhs, rhs_index(k));
                }
                expected[8 * out..8 * out + 8].copy_from_slice(&sum.to_le_bytes());
            }
            Arith::I32 { bits, lhs_unsigned } => {
                let load = |data: &[u8], i: usize, unsigned: bool| -> i32 {
                    match (bits, unsigned) {
                        (8, true) => data[i] as i32,
                        (8, false) => data[i] as i8 as i32,
                        _ => read_i32(data, i),
                    }
                };
                let mut sum = d.acc.map_or(0, |a| read_i32(a, out));
                for k in 0..ks {
                    let l = load(d.lhs, k + m * ks, lhs_unsigned);
                    let r = load(d.rhs, rhs_index(k), false);
                    sum = sum.wrapping_add(l.wrapping_mul(r));
                }
                expected[4 * out..4 * out + 4].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }

    /// Computes every `every`-th element of rows `rows` and columns `cols`
    /// (counting in row-major order, as the check loop does).
    fn reference(
        &self,
        d: &MatmulData<'_>,
        expected: &mut [u8],
        rows: std::ops::Range<u64>,
        cols: std::ops::Range<u64>,
        every: u64,
    ) {
        let mut count = 0;
        for m in rows {
            for n in cols.clone() {
                count += 1;
                if count < every {
                    continue;
                }
                count = 0;
                self.reference_element(d, expected, m, n);
            }
        }
    }

    /// Checks the sampled result elements; the first disagreeing one fails
    /// with `ABORTED` and a printout of the matrices around it.
    fn check(&self, opts: &E2eOptions, d: &MatmulData<'_>) -> Result<()> {
        let every = opts.check_every(self.m * self.n, self.n);
        let mut expected = vec![0u8; d.actual.len()];
        self.reference(d, &mut expected, 0..self.m, 0..self.n, every);
        let mut count = 0;
        for m in 0..self.m {
            for n in 0..self.n {
                count += 1;
                if count < every {
                    continue;
                }
                count = 0;
                let idx = (m * self.n + n) as usize;
                let actual = Value::read(d.actual, idx, self.acc_type)?;
                let wanted = Value::read(&expected, idx, self.acc_type)?;
                if !agree(opts, wanted, actual)? {
                    return Err(self.failure(opts, d, &mut expected, m, n, actual, wanted));
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn failure(
        &self,
        opts: &E2eOptions,
        d: &MatmulData<'_>,
        expected: &mut [u8],
        row: u64,
        col: u64,
        actual: Value,
        wanted: Value,
    ) -> Status {
        let env = |name: &str| -> u64 {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(16)
        };
        let (cm, cn, ck) = (
            env("IREE_MATMUL_TEST_SHOW_CONTEXT_M"),
            env("IREE_MATMUL_TEST_SHOW_CONTEXT_N"),
            env("IREE_MATMUL_TEST_SHOW_CONTEXT_K"),
        );
        let m0 = row.saturating_sub(cm / 2);
        let n0 = col.saturating_sub(cn / 2);
        let rows = m0..self.m.min(m0 + cm);
        let cols = n0..self.n.min(n0 + cn);
        let ks = 0..self.k.min(ck);
        self.reference(d, expected, rows.clone(), cols.clone(), 1);
        let mut s = format!(
            "the actual and expected result matrices disagree at row {row}, column {col}.\n\n\
             actual value: {}\nexpected value: {}\n\n",
            actual.format(),
            wanted.format()
        );
        let mut print = |label: &str,
                         nrows: u64,
                         r: &std::ops::Range<u64>,
                         ncols: u64,
                         c: &std::ops::Range<u64>,
                         et: ElementType,
                         data: &[u8],
                         other: Option<(&[u8], bool)>| {
            print_matrix(&mut s, opts, label, nrows, r, ncols, c, et, data, other);
            s.push('\n');
        };
        print(
            "left-hand side",
            self.m,
            &rows,
            self.k,
            &ks,
            self.lhs_type,
            d.lhs,
            None,
        );
        print(
            "right-hand side",
            self.k,
            &ks,
            self.n,
            &cols,
            self.rhs_type,
            d.rhs,
            None,
        );
        if let Some(acc) = d.acc {
            print(
                "input accumulator",
                self.m,
                &rows,
                self.n,
                &cols,
                self.acc_type,
                acc,
                None,
            );
        }
        print(
            "expected result",
            self.m,
            &rows,
            self.n,
            &cols,
            self.acc_type,
            expected,
            Some((d.actual, true)),
        );
        print(
            "actual result",
            self.m,
            &rows,
            self.n,
            &cols,
            self.acc_type,
            d.actual,
            Some((expected, false)),
        );
        Status::new(StatusCode::Aborted, s.trim_end().to_string())
    }
}

fn unhandled(l: ElementType, r: ElementType, a: ElementType) -> Result<Arith> {
    bail!(
        InvalidArgument,
        "unhandled combination of element types in matmul: lhs {l}, rhs {r}, accumulator/result {a}"
    )
}

/// Appends rows `r` and columns `c` of a row-major `nrows`×`ncols` matrix to
/// `s`, right-aligned; with `other`, elements disagreeing with it get the
/// [`highlight`] mark.
#[allow(clippy::too_many_arguments)]
pub(crate) fn print_matrix(
    s: &mut String,
    opts: &E2eOptions,
    label: &str,
    nrows: u64,
    r: &std::ops::Range<u64>,
    ncols: u64,
    c: &std::ops::Range<u64>,
    et: ElementType,
    data: &[u8],
    other: Option<(&[u8], bool)>,
) {
    let cell = |bytes: &[u8], row: u64, col: u64| {
        Value::read(bytes, (col + row * ncols) as usize, et).ok()
    };
    let mut width = 0;
    for row in r.clone() {
        for col in c.clone() {
            for bytes in std::iter::once(data).chain(other.map(|o| o.0)) {
                if let Some(v) = cell(bytes, row, col) {
                    width = width.max(v.format().len());
                }
            }
        }
    }
    let _ = writeln!(
        s,
        "{label} (rows {}..{} out of 0..{}, columns {}..{} out of 0..{})",
        r.start as i64,
        r.end as i64 - 1,
        nrows as i64 - 1,
        c.start as i64,
        c.end as i64 - 1,
        ncols as i64 - 1
    );
    for row in r.clone() {
        for col in c.clone() {
            let v = cell(data, row, col);
            let text = v.map_or_else(|| "?".to_string(), |v| v.format());
            let mark = match (other, v) {
                (Some((o, good)), Some(v)) => match cell(o, row, col) {
                    Some(w) if agree(opts, v, w).unwrap_or(false) => "  ",
                    _ => highlight(good),
                },
                _ => "  ",
            };
            let _ = write!(s, "{text:>width$}{mark} ");
        }
        s.push('\n');
    }
}
