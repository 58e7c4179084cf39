//! # gpufl-upload
//!
//! The client side of the server's upload protocol (docs/server-api.md).
