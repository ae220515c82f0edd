//! The value every contender caches.

use serde::{Deserialize, Serialize};

/// A product page's data: the row and its category's figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Product {
    /// Its id.
    pub id: i32,
    /// Its name.
    pub name: String,
    /// Its price.
    pub price_cents: i32,
    /// Units in stock.
    pub stock: i32,
    /// Its category's name.
    pub category: String,
    /// Products in its category.
    pub in_category: i64,
    /// The category's average price.
    pub average_cents: i64,
    /// The category's median price.
    pub median_cents: i64,
    /// Products of the category that are cheaper.
    pub cheaper: i64,
}
