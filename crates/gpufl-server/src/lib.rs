//! # gpufl-server
//!
//! `gpufl serve`: uploads, ingest and the JSON API (docs/server-api.md).
