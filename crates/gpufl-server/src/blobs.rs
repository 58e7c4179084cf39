//! Raw files in an object store: a local directory by default, S3 (or any S3 API) for scale.
//! Part `i` of file `F` of session `S` of project `P` is the object `sessions/P/S/F/i` (index
//! zero-padded so that listings sort), written once the server has checked its hash.

use crate::error::ServerError;
use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, PutPayload};
use std::sync::Arc;

#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
    /// What the store is, for logs (`file:///…`, `s3://bucket/prefix`).
    pub describe: String,
}

impl Blobs {
    /// `s3://bucket[/prefix]` (endpoint, region and credentials from the `AWS_*` variables:
    /// `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_ALLOW_HTTP=true` for a plain-http endpoint), `file:///dir` or a directory path.
    pub fn open(url: &str) -> Result<Blobs, ServerError> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(ServerError::Config(format!("--store {url:?}: no bucket")));
            }
            let s3 = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()?;
            let store: Arc<dyn ObjectStore> = if prefix.trim_matches('/').is_empty() {
                Arc::new(s3)
            } else {
                Arc::new(PrefixStore::new(s3, prefix.trim_matches('/')))
            };
            return Ok(Blobs {
                store,
                describe: url.to_string(),
            });
        }
        let dir = url.strip_prefix("file://").unwrap_or(url);
        std::fs::create_dir_all(dir).map_err(|e| ServerError::io(format!("creating {dir}"), e))?;
        let store = LocalFileSystem::new_with_prefix(dir)?;
        Ok(Blobs {
            store: Arc::new(store),
            describe: format!("file://{dir}"),
        })
    }

    fn path(project: &str, session: &str, file: &str, idx: i64) -> ObjPath {
        ObjPath::from(format!("sessions/{project}/{session}/{file}/{idx:08}"))
    }

    pub async fn put_part(
        &self,
        project: &str,
        session: &str,
        file: &str,
        idx: i64,
        bytes: Bytes,
    ) -> Result<(), object_store::Error> {
        self.store
            .put(
                &Self::path(project, session, file, idx),
                PutPayload::from_bytes(bytes),
            )
            .await
            .map(|_| ())
    }

    pub async fn get_part(
        &self,
        project: &str,
        session: &str,
        file: &str,
        idx: i64,
    ) -> Result<Bytes, object_store::Error> {
        self.store
            .get(&Self::path(project, session, file, idx))
            .await?
            .bytes()
            .await
    }
}
