//! Raw files in an object store: a local directory by default, S3 (or any S3 API) for scale.
//! Part `i` of file `F` of session `S` of project `P` is the object `sessions/P/S/F/i.H.R` (index
//! zero-padded so that listings sort; `H` the first 16 hex digits of the part's SHA-256, `R` random
//! per write), written
//! once the server has checked its hash and before the part's row names it (the rows are in
//! [`crate::store::parts`]). Parts stored by schema 1 are `sessions/P/S/F/i`.

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

    /// The object of a part stored before its name carried its hash (schema 1): `…/{idx:08}`.
    pub fn legacy_name(project: &str, session: &str, file: &str, idx: i64) -> String {
        format!("sessions/{project}/{session}/{file}/{idx:08}")
    }

    /// A new object for part `idx` of `file` with SHA-256 `sha256`: `…/{idx:08}.{first 16 hex
    /// digits of the hash}.{token}`, `token` random per write. No two writes share an object, so
    /// a part's row (which names its object) and the object's bytes always agree, however
    /// requests race; an object no row names is garbage (see [`crate::store::Db::intend_blob`]).
    pub fn part_name(
        project: &str,
        session: &str,
        file: &str,
        idx: i64,
        sha256: &str,
        token: &str,
    ) -> String {
        let h = &sha256[..sha256.len().min(16)];
        format!("sessions/{project}/{session}/{file}/{idx:08}.{h}.{token}")
    }

    /// Write object `name` (a whole object appears at once: the local store writes a temporary
    /// file and renames it, S3 publishes on completion).
    pub async fn put(&self, name: &str, bytes: Bytes) -> Result<(), object_store::Error> {
        self.store
            .put(&ObjPath::from(name), PutPayload::from_bytes(bytes))
            .await
            .map(|_| ())
    }

    /// The bytes of object `name`.
    pub async fn get(&self, name: &str) -> Result<Bytes, object_store::Error> {
        self.store.get(&ObjPath::from(name)).await?.bytes().await
    }

    /// Remove object `name`; one already gone is no error.
    pub async fn delete(&self, name: &str) -> Result<(), object_store::Error> {
        match self.store.delete(&ObjPath::from(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The names of the objects under `prefix` (`sessions/P/S/`).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, object_store::Error> {
        use futures_util::TryStreamExt;
        let p = ObjPath::from(prefix);
        let metas: Vec<object_store::ObjectMeta> = self.store.list(Some(&p)).try_collect().await?;
        Ok(metas.into_iter().map(|m| m.location.to_string()).collect())
    }
}
