//! Method 0: MPI RMA windows (to be written).
