//! cuDNN 9, opened by its own name (`libcudnn.so.9`) and nothing else, with the functions kiln
//! calls.
//!
//! Why not cudarc's bindings: cudarc opens `libcudnn.so` first, which on a machine with cuDNN 8's
//! development link loads cuDNN 8 even after kiln opened the pip wheel's cuDNN 9 (the names
//! differ, so the loader does not match them); and its status and algorithm types are Rust
//! enums of cuDNN 9's values, so any other value cuDNN hands back (cuDNN 8's statuses, a newer
//! algorithm) would be undefined behaviour. Here every enum crosses as a plain `int`, and only
//! cuDNN 9 is opened (kiln-backend's probe opens the file it found first, by path, so that this
//! name finds it).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// cuDNN's opaque handle and descriptor pointers.
pub(crate) type Handle = *mut c_void;
pub(crate) type Desc = *mut c_void;
/// `cudnnStatus_t` and every other C enum, as the `int` they are.
pub(crate) type Status = c_int;

/// One result of `cudnnFind*AlgorithmEx` (`cudnnConvolution*AlgoPerf_t`, the same layout for
/// the three passes), its enums as `int`s.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AlgoPerf {
    pub algo: c_int,
    pub status: Status,
    pub time: f32,
    pub memory: usize,
    pub determinism: c_int,
    pub math_type: c_int,
    pub reserved: [c_int; 3],
}

/// The library's name: cuDNN 9's soname.
pub(crate) const NAME: &str = "libcudnn.so.9";

macro_rules! functions {
    ($($name:ident($($ty:ty),* $(,)?) $(-> $ret:ty)?;)*) => {
        /// The functions of cuDNN that kiln calls, resolved once.
        #[allow(non_snake_case)]
        pub(crate) struct Library {
            _library: libloading::Library,
            $(pub(crate) $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl Library {
            #[allow(non_snake_case)]
            fn resolve(library: libloading::Library) -> Result<Self, String> {
                $(
                    // SAFETY: the type is the function's C signature in cuDNN 9's headers.
                    let $name = *unsafe {
                        library.get::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                    }
                    .map_err(|e| format!("{NAME} has no {}: {e}", stringify!($name)))?;
                )*
                Ok(Library { _library: library, $($name,)* })
            }
        }
    };
}

functions! {
    cudnnGetVersion() -> usize;
    cudnnGetErrorString(Status) -> *const c_char;
    cudnnCreate(*mut Handle) -> Status;
    cudnnSetStream(Handle, *mut c_void) -> Status;
    cudnnCreateTensorDescriptor(*mut Desc) -> Status;
    cudnnDestroyTensorDescriptor(Desc) -> Status;
    cudnnSetTensorNdDescriptor(Desc, c_int, c_int, *const c_int, *const c_int) -> Status;
    cudnnCreateFilterDescriptor(*mut Desc) -> Status;
    cudnnDestroyFilterDescriptor(Desc) -> Status;
    cudnnSetFilter4dDescriptor(Desc, c_int, c_int, c_int, c_int, c_int, c_int) -> Status;
    cudnnCreateConvolutionDescriptor(*mut Desc) -> Status;
    cudnnDestroyConvolutionDescriptor(Desc) -> Status;
    cudnnSetConvolution2dDescriptor(
        Desc, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int,
    ) -> Status;
    cudnnSetConvolutionMathType(Desc, c_int) -> Status;
    cudnnSetConvolutionGroupCount(Desc, c_int) -> Status;
    cudnnGetConvolutionForwardWorkspaceSize(
        Handle, Desc, Desc, Desc, Desc, c_int, *mut usize,
    ) -> Status;
    cudnnGetConvolutionBackwardDataWorkspaceSize(
        Handle, Desc, Desc, Desc, Desc, c_int, *mut usize,
    ) -> Status;
    cudnnGetConvolutionBackwardFilterWorkspaceSize(
        Handle, Desc, Desc, Desc, Desc, c_int, *mut usize,
    ) -> Status;
    cudnnFindConvolutionForwardAlgorithmEx(
        Handle, Desc, *const c_void, Desc, *const c_void, Desc, Desc, *mut c_void,
        c_int, *mut c_int, *mut AlgoPerf, *mut c_void, usize,
    ) -> Status;
    cudnnFindConvolutionBackwardDataAlgorithmEx(
        Handle, Desc, *const c_void, Desc, *const c_void, Desc, Desc, *mut c_void,
        c_int, *mut c_int, *mut AlgoPerf, *mut c_void, usize,
    ) -> Status;
    cudnnFindConvolutionBackwardFilterAlgorithmEx(
        Handle, Desc, *const c_void, Desc, *const c_void, Desc, Desc, *mut c_void,
        c_int, *mut c_int, *mut AlgoPerf, *mut c_void, usize,
    ) -> Status;
    cudnnConvolutionForward(
        Handle, *const c_void, Desc, *const c_void, Desc, *const c_void, Desc, c_int,
        *mut c_void, usize, *const c_void, Desc, *mut c_void,
    ) -> Status;
    cudnnConvolutionBackwardData(
        Handle, *const c_void, Desc, *const c_void, Desc, *const c_void, Desc, c_int,
        *mut c_void, usize, *const c_void, Desc, *mut c_void,
    ) -> Status;
    cudnnConvolutionBackwardFilter(
        Handle, *const c_void, Desc, *const c_void, Desc, *const c_void, Desc, c_int,
        *mut c_void, usize, *const c_void, Desc, *mut c_void,
    ) -> Status;
    cudnnDeriveBNTensorDescriptor(Desc, Desc, c_int) -> Status;
    cudnnBatchNormalizationForwardTraining(
        Handle, c_int, *const c_void, *const c_void, Desc, *const c_void, Desc, *mut c_void,
        Desc, *const c_void, *const c_void, f64, *mut c_void, *mut c_void, f64, *mut c_void,
        *mut c_void,
    ) -> Status;
    cudnnBatchNormalizationBackward(
        Handle, c_int, *const c_void, *const c_void, *const c_void, *const c_void, Desc,
        *const c_void, Desc, *const c_void, Desc, *mut c_void, Desc, *const c_void,
        *mut c_void, *mut c_void, f64, *const c_void, *const c_void,
    ) -> Status;
}

impl Library {
    /// `status` in cuDNN's words, with its number.
    pub(crate) fn describe(&self, status: Status) -> String {
        // SAFETY: cuDNN returns a static string for any value.
        let text = unsafe { (self.cudnnGetErrorString)(status) };
        if text.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated and static (cuDNN's message table).
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        format!("{text} ({status})")
    }
}

/// cuDNN 9, opened once; or why it is not used (missing, not 9, a function missing).
pub(crate) fn library() -> Result<&'static Library, &'static str> {
    static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();
    LIBRARY.get_or_init(open).as_ref().map_err(String::as_str)
}

fn open() -> Result<Library, String> {
    // SAFETY: cuDNN runs no initialisers with requirements on the caller.
    let library = unsafe { libloading::Library::new(NAME) }
        .map_err(|e| format!("{NAME} (cuDNN 9) could not be opened: {e}"))?;
    let library = Library::resolve(library)?;
    // SAFETY: takes no arguments.
    let version = unsafe { (library.cudnnGetVersion)() };
    super::plan::require_9(version)?;
    Ok(library)
}
