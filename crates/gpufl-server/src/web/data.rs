//! What the pages read from the store, as pages want it: a missing session is
//! [`WebError::NotFound`], a stored document is parsed into the page's own type.

use super::WebError;
use crate::store::SessionRow;
use crate::AppState;

/// A session of the project, or [`WebError::NotFound`].
pub async fn session(st: &AppState, project: &str, id: &str) -> Result<SessionRow, WebError> {
    st.db
        .session(project, id)
        .await?
        .ok_or_else(|| WebError::NotFound(format!("no session {id:?} in this project")))
}

/// A stored document parsed into `T` (only the fields `T` names are kept).
pub async fn doc<T: serde::de::DeserializeOwned>(
    st: &AppState,
    project: &str,
    id: &str,
    kind: &str,
) -> Result<Option<T>, WebError> {
    match st.db.doc(project, id, kind).await? {
        Some(s) => serde_json::from_str(&s)
            .map(Some)
            .map_err(|e| WebError::Internal(format!("stored {kind} document: {e}"))),
        None => Ok(None),
    }
}
